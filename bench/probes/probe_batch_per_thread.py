"""A batch per thread against a batch over all threads, by the cores' placement: would a
HOGWILD engine at batch granularity escape the two-dies penalty?

    python bench/probes/probe_batch_per_thread.py --data datasets/debdeps/train.txt --seconds 150

The engine splits each batch over its threads, phase by phase (per-sample loops, the block's
products, the row steps), and each phase reads what the other core wrote in the one before.
With the host's two cores on two dies that costs 13-24 % a batch, while two independent
one-thread engines lose nothing (``probe_placement_sharing.py``). Here two Python threads
each train their own stream of batches with one Numba thread, on two networks that share one
set of weights and Adam moments (``copy.deepcopy`` of a fitted model whose W, B and moments
are then rebound to the first's: HOGWILD between the streams, nothing else shared); blocks of
it alternate with blocks of the engine as it is (one stream, two threads), each block between
two readings of the round trip. Prints the median ms a batch of both by placement. Scratch
quality: the two streams keep step counters of their own (the catch-up sees the other's steps
as none missed), and accuracy is not measured.
"""
import argparse
import copy
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="an XC training file")
    ap.add_argument("--seconds", type=float, default=150.0)
    ap.add_argument("--block", type=int, default=25, help="batches a block (a stream's)")
    args = ap.parse_args()
    import numba
    import slide
    from threadpoolctl import threadpool_limits
    from bench.common import git_commit
    from bench.crosscore import placement, round_trip_ns
    from bench.probes.probe_block_phases import as_fit_rows
    X, Y, _ = as_fit_rows(*slide.read_xc(args.data))
    max_labels = int(np.diff(Y.indptr).max())
    a = slide.SlideClassifier(learning_rate=1e-3, lr_schedule="constant", epochs=1, n_threads=2,
                              random_state=0, neighbours=0, rerank=False).fit(X[:2048], Y[:2048])
    b = copy.deepcopy(a)
    net_a, opt_a, net_b, opt_b = a.network_, a.optimizer_, b.network_, b.optimizer_
    net_b.W, net_b.B = net_a.W, net_a.B
    for k in ("MW", "VW", "MB", "VB", "TW", "TB"):
        setattr(opt_b, k, getattr(opt_a, k))
    order = np.random.default_rng(1).permutation(X.shape[0]).astype(np.int64)
    n_b = X.shape[0] // 128
    state = {"b": 0, "serial": 10 ** 6}

    def batches(k):
        b0 = state["b"]
        state["b"] += k
        state["serial"] += k + 10
        return [order[128 * ((b0 + j) % n_b):128 * ((b0 + j) % n_b + 1)] for j in range(k)], \
            state["serial"]

    def train(net, opt, rows_list, serial0):
        for i, rows in enumerate(rows_list):
            net.train_batch(X, Y, rows, 0, serial0 + i, opt)

    def split_over_threads(k):
        numba.set_num_threads(2)
        net_a.prepare(128, 2, max_labels)
        rows_list, s0 = batches(k)
        t = time.perf_counter()
        train(net_a, opt_a, rows_list, s0)
        return (time.perf_counter() - t) / k

    def batch_per_thread(k):
        rows_list, s0 = batches(2 * k)
        start = threading.Barrier(2)

        def stream(net, opt, part, serial0):
            numba.set_num_threads(1)        # thread-local in Numba
            start.wait()
            train(net, opt, part, serial0)

        threads = [threading.Thread(target=stream, args=(net_a, opt_a, rows_list[:k], s0)),
                   threading.Thread(target=stream, args=(net_b, opt_b, rows_list[k:], s0 + k))]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return (time.perf_counter() - t) / (2 * k)

    print(f"commit {git_commit()}; data {args.data}; blocks of {args.block} batches a stream")
    res = {}
    with threadpool_limits(1, user_api="blas"):
        net_b.prepare(128, 2, max_labels)
        split_over_threads(5)
        batch_per_thread(5)
        t_end, i = time.time() + args.seconds, 0
        while time.time() < t_end:
            way = (split_over_threads, batch_per_thread)[i % 2]
            i += 1
            r0 = round_trip_ns(n=20000)
            ms = way(args.block) * 1e3
            res.setdefault(way.__name__, {}).setdefault(
                placement(r0, round_trip_ns(n=20000)), []).append(ms)
    print("\n| way | blocks near | ms a batch near | blocks far | ms a batch far | far / near |\n"
          "|---|---|---|---|---|---|")
    for name in ("split_over_threads", "batch_per_thread"):
        r = res.get(name, {})
        m = [np.median(r[w]) if r.get(w) else np.nan for w in ("near", "far")]
        n = [len(r.get(w, [])) for w in ("near", "far")]
        print(f"| {name} | {n[0]} | {m[0]:.3f} | {n[1]} | {m[1]:.3f} | {m[1] / m[0]:.2f} |")


if __name__ == "__main__":
    main()
