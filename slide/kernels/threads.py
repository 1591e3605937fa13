"""Which threads run slide's parallel kernels: Numba's TBB layer where TBB is installed.

Numba's OpenMP layer ends every parallel loop at a barrier that waits for every one of its
threads. When another job holds one of the cores, the thread parked there joins each barrier
a scheduler time slice late, and a batch has a dozen parallel loops. TBB steals: the chunks a
parked thread has not started run on the threads that are awake, and nothing waits for it.
Beside one busy loop on 2 cores the network trained in 0.12-0.25x OpenMP's time on TBB, and
alone in the same time (``bench/results/threading_layer_{quiet,busy}_51cf439.md``;
``docs/design.md``).

Numba prefers TBB when it can load ``libtbb.so.12`` (its default layer order is TBB, OpenMP,
workqueue), but the ``tbb`` wheel puts the library in ``<prefix>/lib``, where the dynamic
loader does not look. Loading it here by its full path, before the first parallel kernel
starts Numba's threads, lets Numba find it already loaded. ``NUMBA_THREADING_LAYER`` set to
anything else keeps the user's choice; without the ``tbb`` package nothing changes (OpenMP).
"""
import ctypes
import os
from concurrent.futures import ThreadPoolExecutor
import site
import sys
import warnings

import numba
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

TBB_LIBRARY = {"linux": "libtbb.so.12", "darwin": "libtbb.12.dylib"}


def _candidates(name):
    """Where a pip-installed ``tbb`` puts its library: the environment's ``lib``, the base
    installation's, the user site's."""
    prefixes = [sys.prefix, sys.base_prefix, getattr(site, "USER_BASE", None) or ""]
    seen = []
    for p in prefixes:
        path = os.path.join(p, "lib", name)
        if p and path not in seen:
            seen.append(path)
    return seen


def preload_tbb():
    """Load TBB's library globally if a ``tbb`` package installed one and the user did not
    pick another threading layer; returns its path, or None."""
    layer = os.environ.get("NUMBA_THREADING_LAYER", "default").lower()
    name = next((v for k, v in TBB_LIBRARY.items() if sys.platform.startswith(k)), None)
    if name is None or layer not in ("default", "tbb", "safe"):
        return None
    for path in _candidates(name):
        if os.path.exists(path):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                continue
            return path
    return None


TBB_PATH = preload_tbb()


def layer_warning(n_threads, layer):
    """The warning for a run on ``n_threads`` threads whose parallel loops run on Numba's
    ``layer`` (None: nothing to say). Not TBB where the user did not choose it means the tbb
    package is missing (no wheel for this platform, or slide run from a source tree without
    its dependencies): OpenMP's loops wait for every thread, and beside one busy core a batch
    at 16 threads took 17x TBB's time (bench/results/device_phases_3ded589/README.md)."""
    chosen = os.environ.get("NUMBA_THREADING_LAYER", "default").lower()
    if n_threads < 2 or layer in (None, "tbb") or chosen not in ("default", "tbb", "safe"):
        return None
    return (f"slide's parallel loops run on Numba's {layer!r} threading layer, not TBB: its "
            f"loops wait for every one of the {n_threads} threads, so a core busy with another "
            f"job stalls every batch (17x slower at 16 threads beside one busy core, "
            f"docs/design.md). Install the 'tbb' package (pip install tbb) where it exists "
            f"for this platform, or set NUMBA_THREADING_LAYER to keep this layer quietly.")


_WARNED = []


def warn_if_not_tbb(n_threads):
    """Warn once a process (``layer_warning``) after Numba's threads started."""
    if _WARNED:
        return
    try:
        layer = numba.threading_layer()
    except ValueError:          # no parallel loop ran yet: the layer is not chosen
        return
    message = layer_warning(int(n_threads), layer)
    if message is not None:
        _WARNED.append(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def threads_for(n_threads):
    """The threads a fit asking for ``n_threads`` (None: all) runs on: at most Numba's."""
    most = numba.config.NUMBA_NUM_THREADS
    return most if n_threads is None else min(int(n_threads), most)


def on_row_slices(n_rows, run, min_rows=1):
    """``run(lo, hi)`` over one slice of rows 0..n_rows per Numba thread (slices of at least
    ``min_rows`` rows), on Python threads, for kernels that release the GIL (``nogil``): a
    ``prange`` kernel of the same work compiles several times slower (a parallel loop's body is
    typed again, outlined and its machine code generated twice: ``docs/design.md``, "A batch
    on one thread"). Returns the runs' results in slice order; one slice runs on the calling
    thread."""
    parts = max(1, min(numba.get_num_threads(), int(n_rows) // max(1, int(min_rows))))
    bounds = [(c * int(n_rows)) // parts for c in range(parts + 1)]
    if parts == 1:
        return [run(0, int(n_rows))]
    with ThreadPoolExecutor(parts) as pool:
        return list(pool.map(lambda c: run(bounds[c], bounds[c + 1]), range(parts)))


def _call_layer_symbol(builder, name, ret, args, values):
    """Call the threading layer's C function ``name`` by its symbol (Numba registers the
    symbols when its threads start: call ``numba.get_num_threads()`` first). The thread count
    a kernel needs is passed in instead (Numba's ``get_num_threads`` inside a kernel goes
    through a ctypes pointer too)."""
    fnty = ir.FunctionType(ret, args)
    fn = builder.module.globals.get(name) or ir.Function(builder.module, fnty, name=name)
    return builder.call(fn, values)


@intrinsic
def set_chunk_size(typingctx, n):
    """``numba.set_parallel_chunksize(n)`` inside a kernel (0: Numba's default scheduling).
    Numba's own version calls the layer through a ctypes pointer, which keeps every kernel
    that uses it out of the on-disk cache (a compiled batch then recompiled in every
    process); the call by symbol, as ``numba.get_thread_id`` does, caches."""
    sig = types.void(n)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        value = builder.trunc(args[0], i32) if args[0].type.width > 32 else args[0]
        _call_layer_symbol(builder, "set_parallel_chunksize", i32, [i32], [value])
        return context.get_dummy_value()

    return sig, codegen
