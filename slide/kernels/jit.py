"""``njit``: Numba's ``njit`` as slide compiles its kernels, without the C-callable wrapper.

Numba builds two wrappers around every function it compiles: one that Python calls it through,
and one with a plain C signature (for callers that take the function's address: ``@cfunc``
users, first-class function values). slide never takes a kernel's address nor passes a kernel
as a value, so the second wrapper is dead code that Numba still lowers, optimises and turns
into machine code for every kernel, and again wherever a caller links the kernel in; the
batch's kernels, whose bundles flatten into hundreds of arguments, have the largest ones.
Without them a cold compile is some 5 % shorter (``bench/results/first_fit_debtags.md``,
"Kernels built without Numba's C-callable wrapper"). Every kernel module takes ``njit``
from here (``tests/test_codegen.py`` checks that every kernel of slide's modules does).
"""
import numba


def njit(*args, **options):
    """``numba.njit`` with ``no_cfunc_wrapper=True`` unless the options say otherwise."""
    options.setdefault("no_cfunc_wrapper", True)
    return numba.njit(*args, **options)
