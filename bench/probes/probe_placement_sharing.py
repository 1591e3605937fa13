"""Is the far penalty the data the two threads share, or the host? Two independent one-thread
engines (two processes, one pinned to each CPU, nothing shared) against the two-thread engine,
block by block, each block between two readings of the cores' round trip.

    python bench/probes/probe_placement_sharing.py --data datasets/debdeps/train.txt --seconds 240

The two-thread engine is slower with the cores on two dies than on one (1.27-1.35x a batch,
``docs/history.md``, twenty-second session). If the two independent processes slow as much, the
cause is where the host puts the cores (its other tenants, clocks), which no layout of the
engine's data can change; if they do not, it is what the threads hand each other. Three worker
processes train the same network on the same data (a compile fit first, then blocks of shuffled
batches): ``solo0`` and ``solo1`` with one Numba thread each, pinned to CPU 0 and CPU 1, and
``pair`` with two threads. The parent releases the two solos together for one block, then the
pair alone, and reads the round trip before and after each (the others wait asleep in a
barrier). Prints each worker's median ms a batch near and far and their ratio.
"""
import argparse
import multiprocessing as mp
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _worker(name, data, threads, cpus, go, done, out, block, untimed):
    """One engine: a compile fit, then a block of batches each time ``go`` releases it; the
    block's ms a batch goes to ``out``."""
    os.environ["NUMBA_NUM_THREADS"] = str(threads)
    os.sched_setaffinity(0, cpus)
    import slide
    from threadpoolctl import threadpool_limits
    from bench.probes.probe_block_phases import _time_batches, as_fit_rows
    from slide.kernels.arrays import csr
    X, Y, _ = as_fit_rows(*slide.read_xc(data))
    m = slide.SlideClassifier(learning_rate=1e-3, lr_schedule="constant", epochs=1,
                              n_threads=threads, random_state=0, neighbours=0, rerank=False)
    m.fit(X[:2048], Y[:2048])
    net, opt = m.network_, m.optimizer_
    net.prepare(128, threads, int(np.diff(Y.indptr).max()))
    order = np.random.default_rng(1 + cpus[0] if threads == 1 else 1).permutation(X.shape[0])
    Xc, Yc = csr(X), csr(Y)
    n_b = X.shape[0] // 128
    b0, serial = 0, 10 ** 6
    with threadpool_limits(1, user_api="blas"):
        _time_batches(net, opt, X, Xc, Yc, [order[:128], order[128:256]], 500, 1)
        out.put((name, "ready", 0.0))
        while True:
            go.wait()
            rows_of = [order[128 * ((b0 + k) % n_b):128 * ((b0 + k) % n_b + 1)]
                       for k in range(block)]
            T = _time_batches(net, opt, X, Xc, Yc, rows_of, serial, untimed)
            b0, serial = b0 + block, serial + block + 10
            out.put((name, "block", sum(T.values()) / (block - untimed) * 1e3))
            done.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="an XC training file")
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--block", type=int, default=30, help="batches a block (first 5 untimed)")
    args = ap.parse_args()
    from bench.common import git_commit
    from bench.crosscore import placement, round_trip_ns
    cpus = sorted(os.sched_getaffinity(0))[:2]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    solo_go, solo_done = ctx.Barrier(3), ctx.Barrier(3)
    pair_go, pair_done = ctx.Barrier(2), ctx.Barrier(2)
    workers = [ctx.Process(target=_worker, daemon=True,
                           args=(f"solo{c}", args.data, 1, [c], solo_go, solo_done, out,
                                 args.block, 5)) for c in cpus]
    workers.append(ctx.Process(target=_worker, daemon=True,
                               args=("pair", args.data, 2, cpus, pair_go, pair_done, out,
                                     args.block, 5)))
    for w in workers:
        w.start()
    for _ in workers:
        assert out.get(timeout=600)[1] == "ready"
    print(f"commit {git_commit()}; data {args.data}; CPUs {cpus}; blocks of {args.block - 5} "
          "timed batches")
    res = {"near": {}, "far": {}}
    t_end = time.time() + args.seconds
    while time.time() < t_end:
        for go, done, n in ((solo_go, solo_done, 2), (pair_go, pair_done, 1)):
            r0 = round_trip_ns(n=20000)
            go.wait()
            got = [out.get(timeout=600) for _ in range(n)]
            done.wait()
            where = placement(r0, round_trip_ns(n=20000))
            if where in res:
                for name, _, ms in got:
                    res[where].setdefault(name, []).append(ms)
    for w in workers:
        w.terminate()
    print("\n| worker | blocks near | ms a batch near | blocks far | ms a batch far | "
          "far / near |\n|---|---|---|---|---|---|")
    for name in ("solo%d" % cpus[0], "solo%d" % cpus[1], "pair"):
        m = [np.median(res[w][name]) if res[w].get(name) else np.nan for w in ("near", "far")]
        n = [len(res[w].get(name, [])) for w in ("near", "far")]
        print(f"| {name} | {n[0]} | {m[0]:.3f} | {n[1]} | {m[1]:.3f} | {m[1] / m[0]:.2f} |")


if __name__ == "__main__":
    main()
