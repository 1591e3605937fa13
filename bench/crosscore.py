"""How far apart two of this machine's cores are: the round trip of one cache line between
them, in nanoseconds.

    python bench/crosscore.py [--cpus 0,1] [--repeat 5]

A virtual machine's cores are wherever its host puts them. On this project's 2-core
development VM the two cores sometimes share a die and a last-level cache (a round trip of
50-90 ns) and sometimes sit on different dies (340-400 ns), and the host moves them between
the two every minute or so. Single-threaded rates (a GEMM call, a memory stream) do not see
the difference; a two-thread training step, whose threads hand the batch's data to each
other between its phases, does: every line one core wrote and the other reads next crosses
the dies (``docs/design.md``). ``bench/roofline.py`` records this
reading in every round, so that a round's fraction can be read with the placement it ran in.

Two Python threads, each pinned to one core, bounce a counter: each atomically adds one when
the count is its turn (an atomic add: Numba has no atomic load, and a plain load in a spin
loop would be hoisted out of it). Pure Numba, no compiler needed.
"""
import argparse
import os
import threading
import time

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

# a reading whose round trip is at least this is "far": the cores on different dies
FAR_NS = 200.0
# spins a thread waits for its turn before giving up (its partner never ran: a busy core)
SPIN_LIMIT = 2_000_000_000


@intrinsic
def _fetch_add(typingctx, counters, i, v):
    """counters[i] += v atomically (sequentially consistent); the value before."""
    if not isinstance(counters, types.Array) or counters.dtype != types.int64:
        return None
    sig = types.int64(counters, types.intp, types.int64)

    def codegen(context, builder, signature, args):
        arr, idx, val = args
        ary = context.make_array(signature.args[0])(context, builder, arr)
        ptr = cgutils.get_item_pointer(context, builder, signature.args[0], ary, [idx])
        return builder.atomic_rmw("add", ptr, val, "seq_cst")
    return sig, codegen


@njit(cache=True, nogil=True)
def _bounce(flag, n, first):
    """n turns of the side that moves the counter from even to odd (``first``) or from odd to
    even; False if the other side stopped answering."""
    for i in range(n):
        turn = 2 * i if first else 2 * i + 1
        spins = 0
        while _fetch_add(flag, 0, 0) != turn:
            spins += 1
            if spins > SPIN_LIMIT:
                return False
        _fetch_add(flag, 0, 1)
    return True


def round_trip_ns(cpus=None, n=50_000):
    """The mean round trip of a cache line between ``cpus`` (two CPU ids; default the first two
    this process may run on), n round trips; NaN without two distinct usable CPUs or if a
    side did not answer."""
    allowed = sorted(os.sched_getaffinity(0))
    cpus = tuple(cpus) if cpus is not None else tuple(allowed[:2])
    if len(set(cpus)) < 2 or not set(cpus) <= set(allowed):
        # two sides on one CPU would take turns by context switches, not cache transfers
        return float("nan")
    flag = np.zeros(16, np.int64)
    _bounce(flag, 1, True)                       # compile (or load) before the clock
    flag[:] = 0
    start = threading.Barrier(2)
    out = {}

    def side(cpu, first):
        os.sched_setaffinity(0, {cpu})           # this thread only (Linux)
        start.wait()
        t0 = time.perf_counter()
        out[first] = (_bounce(flag, n, first), time.perf_counter() - t0)

    threads = [threading.Thread(target=side, args=(c, f)) for c, f in zip(cpus, (True, False))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not (out[True][0] and out[False][0]):
        return float("nan")
    return out[True][1] / n * 1e9


def median_round_trip_ns(repeat=3, cpus=None):
    """The median of ``repeat`` readings (one reading can fall on a scheduler tick)."""
    return float(np.median([round_trip_ns(cpus) for _ in range(max(1, repeat))]))


def placement(*readings):
    """'near' if every reading is under FAR_NS, 'far' if every one is at or above it, else
    'mixed' (the host moved the cores in between); 'unknown' without a finite reading."""
    r = [x for x in readings if np.isfinite(x)]
    if not r:
        return "unknown"
    if all(x < FAR_NS for x in r):
        return "near"
    if all(x >= FAR_NS for x in r):
        return "far"
    return "mixed"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpus", default=None, help="two CPU ids, e.g. 0,1 (default: the first "
                    "two this process may use)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--every", type=float, default=0.0, help="seconds between readings "
                    "(a log of the placement over time)")
    args = ap.parse_args()
    cpus = tuple(int(c) for c in args.cpus.split(",")) if args.cpus else None
    for _ in range(args.repeat):
        ns = round_trip_ns(cpus)
        print(f"{time.strftime('%H:%M:%S')} round trip {ns:6.1f} ns ({placement(ns)})",
              flush=True)
        time.sleep(args.every)


if __name__ == "__main__":
    main()
