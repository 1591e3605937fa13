"""One-thread builds of parallel kernels: the same source compiled without ``parallel=True``.

A batch that runs on one thread (each of ``batches_in_flight`` workers on a thread of its own:
the default up to 7 cores) runs its parallel loops on that thread alone. Numba's parallel build
of a loop buys it nothing then, and costs compile time: the loop's body is typed a second time,
outlined into a gufunc and its machine code generated three times over. ``one_thread(kernel,
calls)`` returns ``kernel`` compiled with ``prange`` read as ``range``, calling, for each name
in ``calls``, the kernel given there (the callee's own one-thread build) instead of the one its
module defines. The code object is the kernel's, so the arithmetic is too:
``tests/test_one_thread.py`` checks that a batch gives the same bits either way.

The build resolves the kernel's globals in a copy of its module's namespace taken when it is
made: make it once everything the kernel calls is defined (after its module is imported). Its
cache entries sit beside the kernel's under the name ``<kernel>_one_thread``, keyed like it.
"""
import types

from numba.core.caching import NullCache

from slide.kernels.jit import njit

SUFFIX = "_one_thread"


def one_thread(kernel, calls=None):
    """``kernel`` (a Numba dispatcher) compiled without ``parallel``, calling ``calls`` (name
    in ``kernel``'s module -> the dispatcher to call in its place)."""
    callees = dict(calls or {})
    source = kernel.py_func
    unknown = sorted(set(callees) - set(source.__code__.co_names))
    if unknown:
        raise ValueError(f"{source.__qualname__} names no {', '.join(unknown)}")
    scope = dict(source.__globals__)
    scope.update(callees)
    build = types.FunctionType(source.__code__, scope, source.__name__ + SUFFIX,
                               source.__defaults__, source.__closure__)
    build.__qualname__ = source.__qualname__ + SUFFIX
    build.__module__ = source.__module__
    build.__doc__ = f"``{source.__name__}`` on one thread (``slide.kernels.one_thread``)."
    options = {k: v for k, v in kernel.targetoptions.items()
               if k not in ("parallel", "nopython")}   # njit sets nopython itself
    # cached where the kernel is (its decorator's ``cache`` is not among its target options)
    return njit(cache=not isinstance(kernel._cache, NullCache), **options)(build)
