"""What one parallel loop costs before any work: the fork and join of Numba's threads.

A batch of the batched engine runs about a dozen parallel loops, with Python between them.
Each is timed here on its own: a loop over 128 items (a batch's samples) doing ``--work``
multiply-adds each, called ``--calls`` times from Python, with ``--gap-us`` microseconds of
Python busy-wait between calls (the serial code between a batch's kernels, during which a
threading layer's idle workers may go to sleep). Prints microseconds a call against the same
work in one serial loop, at the threads and threading layer of this process
(``NUMBA_THREADING_LAYER``; slide itself picks TBB where installed, ``slide.kernels.threads``).

    NUMBA_THREADING_LAYER=omp python bench/probes/probe_fork_join.py --threads 16
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--work", type=int, default=2000, help="multiply-adds an item")
    ap.add_argument("--gap-us", type=float, default=50.0, help="Python between calls")
    args = ap.parse_args()
    import slide.kernels  # noqa: F401  (loads TBB as slide does)
    import numba
    from numba import njit, prange

    @njit(parallel=True, nogil=True)
    def par(a, out, work):
        for s in prange(out.shape[0]):
            acc = 0.0
            for i in range(work):
                acc += a[(s * 7 + i) % a.shape[0]] * 1.0001
            out[s] = acc

    # the same loop compiled without parallel=True: prange runs as range (neither is cached)
    ser = njit(nogil=True)(par.py_func)

    numba.set_num_threads(args.threads)
    a = np.random.default_rng(0).random(4096)
    out = np.zeros(128)
    par(a, out, args.work)
    ser(a, out, args.work)

    def timed(fn):
        total = 0.0
        for _ in range(args.calls):
            t_end = time.perf_counter() + args.gap_us * 1e-6
            while time.perf_counter() < t_end:
                pass
            t0 = time.perf_counter()
            fn(a, out, args.work)
            total += time.perf_counter() - t0
        return total / args.calls * 1e6

    t_ser = timed(ser)
    t_par = timed(par)
    ideal = t_ser / args.threads
    print(f"layer {numba.threading_layer()} threads {args.threads} work {args.work} gap "
          f"{args.gap_us:.0f} us: serial {t_ser:.1f} us, parallel {t_par:.1f} us a call "
          f"(ideal {ideal:.1f}; overhead {t_par - ideal:.1f} us)")


if __name__ == "__main__":
    main()
