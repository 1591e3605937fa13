"""How Numba compiles slide's kernels: full 512-bit vectors on CPUs with AVX-512.

LLVM tunes code for Intel's AVX-512 CPUs to prefer 256-bit vectors (its ``prefer-256-bit``
tuning: early AVX-512 parts lowered their clock under heavy 512-bit code), so Numba's loops
use half the registers' width. slide's hot loops run over rows of 128 floats (the first
layer's gather-sums and row steps, the output rows' steps): full-width vectors issue half
as many loads, stores and multiply-adds for them (Adam's square roots and divisions cost the
same per float at either width). On a 2-core AVX-512 machine the network's training time went
by 0.90x-1.00x over four data sets (``bench/results/vector_width_da9a682.md``).

The choice is made once, before Numba builds its code generator (at the first compilation or
cache load in the process), by setting ``NUMBA_CPU_FEATURES`` to the host's features with the
tuning turned off. It is left alone when:

- the host has no AVX-512 (or is not x86-64): nothing to gain;
- the user set ``NUMBA_CPU_FEATURES`` (their choice) or ``SLIDE_VECTOR_WIDTH=256``;
- Numba already built its code generator (something compiled before slide was imported):
  changing the features then would mix two code generations in one process.

Numba's on-disk cache keys every entry by these features, so both widths can share a cache.
The features travel in the environment, so subprocesses (Ray workers, the bench's systems)
compile the same way. Results differ from 256-bit code in the last bits of float sums
(``tests/make_golden.py`` keeps a fixture for each width).
"""
import os
import platform

import llvmlite.binding as ll
from numba.core import config
from numba.core.registry import cpu_target

WIDE_TUNING_OFF = "-prefer-256-bit"
# where slide records the features it set itself: a subprocess inherits NUMBA_CPU_FEATURES,
# and this tells slide's choice (which the child's SLIDE_VECTOR_WIDTH may revise) from the
# user's (which stays)
SLIDE_FEATURES = "SLIDE_NUMBA_CPU_FEATURES"


def target_cpu_name():
    """LLVM's name for the CPU the kernels compile for (``znver3``, ``znver4``,
    ``sapphirerapids``, ...): ``NUMBA_CPU_NAME`` where set, else the host's. A VM often hides
    the model name (``AMD EPYC``), and this tells the generations apart, which compile and run
    at different speeds."""
    return os.environ.get("NUMBA_CPU_NAME") or ll.get_host_cpu_name()


def _codegen_started():
    """Whether Numba's CPU code generator exists already in this process."""
    return "_toplevel_target_context" in cpu_target.__dict__


def wide_vector_features(environ=None, machine=None, host_features=None):
    """The ``NUMBA_CPU_FEATURES`` value that turns on 512-bit vectors, or None where slide
    leaves the compilation as it is (the module docstring's cases). The arguments stand in
    for the process's environment, ``platform.machine()`` and LLVM's host features (tests)."""
    environ = os.environ if environ is None else environ
    if not _slides_own(environ) and environ.get("NUMBA_CPU_FEATURES") is not None:
        return None
    width = environ.get("SLIDE_VECTOR_WIDTH", "").strip()
    if width not in ("", "256", "512"):
        raise ValueError(f"SLIDE_VECTOR_WIDTH={width!r}: expected 256 or 512 (or unset)")
    if width == "256":
        return None
    machine = (platform.machine() if machine is None else machine).lower()
    if machine not in ("x86_64", "amd64"):
        return None
    if host_features is None:
        host_features = ll.get_host_cpu_features().flatten()
    flags = host_features.split(",")
    if "+avx512f" not in flags:
        return None
    return ",".join([f for f in flags if f.lstrip("+-") != WIDE_TUNING_OFF[1:]] +
                    [WIDE_TUNING_OFF])


def _slides_own(environ):
    """Whether ``NUMBA_CPU_FEATURES`` is the value slide set (here or in a parent process)."""
    return (environ.get("NUMBA_CPU_FEATURES") is not None and
            environ.get("NUMBA_CPU_FEATURES") == environ.get(SLIDE_FEATURES))


def choose_vector_width(environ=None):
    """Set ``NUMBA_CPU_FEATURES`` for 512-bit vectors where the docstring's rules allow (or
    take back the value a parent process's slide set, where ``SLIDE_VECTOR_WIDTH=256`` asks
    for LLVM's own choice)."""
    environ = os.environ if environ is None else environ
    if _codegen_started():
        return
    features = wide_vector_features(environ)
    if features is not None:
        environ["NUMBA_CPU_FEATURES"] = environ[SLIDE_FEATURES] = features
    elif _slides_own(environ):
        del environ["NUMBA_CPU_FEATURES"], environ[SLIDE_FEATURES]
    else:
        return
    # Numba read its environment when it was imported; the code generator takes the features
    # from that reading (a cache load builds it without a re-read)
    config.reload_config()


def vector_width():
    """The widest vectors Numba's loops use in this process (bits): 512 when the features in
    effect have AVX-512 without the 256-bit preference, else 256 (128 without AVX)."""
    features = config.CPU_FEATURES
    if features is None:
        features = ll.get_host_cpu_features().flatten()
    flags = set(features.split(","))
    if "+avx512f" in flags and WIDE_TUNING_OFF in flags:
        return 512
    if "+avx512f" in flags or "+avx" in flags:
        return 256
    return 128


choose_vector_width()
