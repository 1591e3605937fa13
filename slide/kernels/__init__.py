"""Kernels: module-level ``@njit`` functions over flat arrays and NamedTuple bundles, and the
thin array owners built on them (LSH tables, the serving index). Modules here import only
numpy, numba and each other: ``rng`` (counter-based random numbers), ``layers``, ``arrays``
(the bundles), ``sample`` (one sample's active sets, forward, loss, backward), ``negatives``,
``touched``, ``parse`` (the XC text parser) and ``lsh`` (hashing, tables, sampling, serving).

A one-line helper of a hot loop is a plain ``@njit`` function, which LLVM inlines by itself:
Numba's own ``inline="always"`` translates and types it again at every call site, and inside
a parallel loop's body that is what made the row steps' loop slow to compile
(docs/design.md, "What Numba inlines"). The flag stays where LLVM would leave a call.
"""
# before any kernel is defined: its cache locator is chosen by its decorator (``cache``: keyed
# by the sources its module imports)
from slide.kernels import cache  # noqa: F401,E402
# before any kernel runs: Numba's threads are started by the first parallel one, and its
# code generator (whose CPU features set the vectors' width) by the first compilation
from slide.kernels import codegen  # noqa: F401,E402
from slide.kernels import threads  # noqa: F401,E402
# before the first compilation: Numba's compile flags compared without building dicts
from slide.kernels import compile_flags  # noqa: F401,E402
