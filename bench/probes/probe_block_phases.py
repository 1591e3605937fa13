"""Where the time of a batched-engine batch goes: each step of ``slide.network.block`` timed on
its own, over ``--batches`` shuffled batches of a data set (after a warm-up fit that compiles
every kernel), BLAS single-threaded as in training (``--blas-threads`` to compare).

    python bench/probes/probe_block_phases.py [--data datasets/debcontents] [--batches 150]

Without ``--data``: the ``--preset`` (xc200k: 200k labels; 30,000 points). Prints milliseconds per
batch for: the shared draw (beside the first layer's listing), the per-sample forward (hidden
layers, active sets), the gather of the block's rows with the first product, the corrected
softmax, the two backward products with the bias sums, the per-sample backward, the touched-row listing, the
hidden layers' Adam step, the extras' row step and the block's row step; then the total and
samples/s. ``--compare`` times the engine before this round's many-core changes (each batch's
draw beside its listing, 4 samples a chunk, every sample's extras in its own loop), after them,
and each change alone, in one process on the same batches, and ends with a summary table.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None, help="an XC training file; default: --preset")
    ap.add_argument("--preset", default="xc200k", help="a synthetic preset (xc200k, "
                    "amazon670k, ...) when no --data")
    ap.add_argument("--n-train", type=int, default=30000, help="rows of the preset")
    ap.add_argument("--batches", type=int, default=150)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--blas-threads", type=int, default=1, help="OpenBLAS threads for the "
                    "products (training uses 1: more fight Numba's spinning threads)")
    ap.add_argument("--draw-ahead", type=int, default=1, help="1: the shared negatives drawn "
                    "ahead, one batch a thread (the default); 0: each batch's draw beside its "
                    "listing, as before")
    ap.add_argument("--chunks-per-thread", type=int, default=None, help="the per-sample "
                    "loops' scheduling (block.CHUNKS_PER_THREAD; 0: always CHUNK samples)")
    ap.add_argument("--extras-task", type=int, default=None, help="block.EXTRAS_TASK: extras "
                    "a task beside the products takes (a huge value: none, as before)")
    ap.add_argument("--compare", action="store_true", help="time the engine before the "
                    "many-core changes, after them and each alone, one after the other in this "
                    "process (``COMPARE``), and print a summary table")
    ap.add_argument("--warm-batches", type=int, default=20, help="batches run untimed first "
                    "(a kernel the warm-up fit did not compile in these types compiles there)")
    args = ap.parse_args()
    import numba
    import slide
    from bench.common import git_commit
    from slide.network import block as BK
    from slide.network import extras as EX
    from slide.kernels.arrays import csr
    from threadpoolctl import threadpool_limits
    BK.DRAW_AHEAD = bool(args.draw_ahead)
    if args.extras_task is not None:
        EX.EXTRAS_TASK = args.extras_task
    if args.chunks_per_thread is not None:
        BK.CHUNKS_PER_THREAD = max(args.chunks_per_thread, 0)
    if args.data:
        X, Y = slide.read_xc(args.data)
    else:
        X, Y, _, _ = slide.synthetic.generate(args.preset, seed=0, n_train=args.n_train,
                                              n_test=10)
    from slide.data.inputs import as_feature_matrix, as_label_matrix
    # the canonical dtypes fit uses: other index dtypes would compile other kernel
    # specialisations inside the timed loop
    X = as_feature_matrix(X)
    Y = as_label_matrix(Y, n_rows=X.shape[0])
    print(f"commit {git_commit()}; data {args.data or args.preset}: {X.shape[0]} points, "
          f"{Y.shape[1]} labels")
    m = slide.SlideClassifier(learning_rate=1e-3, lr_schedule="constant", epochs=1,
                              n_threads=args.threads, random_state=0, neighbours=0,
                              rerank=False)
    m.fit(X[:2048], Y[:2048])
    net, opt = m.network_, m.optimizer_
    net.prepare(128, args.threads, int(np.diff(Y.indptr).max()))
    order = np.random.default_rng(1).permutation(X.shape[0]).astype(np.int64)
    Xc, Yc = csr(X), csr(Y)
    configs = COMPARE if args.compare else [("as set", (BK.DRAW_AHEAD, BK.CHUNKS_PER_THREAD,
                                                         EX.EXTRAS_TASK))]
    n_batches = min(args.batches, X.shape[0] // 128 - args.warm_batches)
    print(f"BLAS threads {args.blas_threads}, Numba threads {args.threads} "
          f"({args.warm_batches} batches untimed first, then {n_batches} timed)")
    rows_of = [order[128 * b:128 * (b + 1)] for b in range(args.warm_batches + n_batches)]
    summary = []
    with threadpool_limits(args.blas_threads, user_api="blas"):
        for k, (name, (ahead, per_thread, task)) in enumerate(configs):
            BK.DRAW_AHEAD, BK.CHUNKS_PER_THREAD, EX.EXTRAS_TASK = ahead, per_thread, task
            T = _time_batches(net, opt, X, Xc, Yc, rows_of, 1000 * (k + 1), args.warm_batches)
            total = sum(T.values())
            print(f"\n{name}: draw ahead {ahead}, chunk {BK.chunk_size(128)}, extras task "
                  f"{task}; threading layer {numba.threading_layer()}")
            for key, v in T.items():
                print(f"{key:24s} {v / n_batches * 1e3:6.2f} ms")
            print(f"{'total':24s} {total / n_batches * 1e3:6.2f} ms a batch of 128, "
                  f"{128 * n_batches / total:,.0f} samples/s ({n_batches} batches)")
            summary.append((name, total / n_batches * 1e3, 128 * n_batches / total))
    if len(summary) > 1:
        print("\n| configuration | ms a batch | samples/s |\n|---|---|---|")
        for name, ms, rate in summary:
            print(f"| {name} | {ms:.2f} | {rate:,.0f} |")


# --compare: the engine before the many-core changes, after them, and each change alone
# (DRAW_AHEAD, CHUNKS_PER_THREAD, EXTRAS_TASK), before and after twice, interleaved
_BEFORE = (False, 0, 10 ** 9)
_AFTER = (True, 8, 64)
COMPARE = [("before", _BEFORE), ("after", _AFTER), ("before", _BEFORE), ("after", _AFTER),
           ("draw ahead only", (True, 0, 10 ** 9)), ("chunks only", (False, 8, 10 ** 9)),
           ("extras tasks only", (False, 0, 64)), ("draw ahead + extras tasks", (True, 0, 64))]


def _time_batches(net, opt, X, Xc, Yc, rows_of, serial0, n_warm):
    """Seconds of each step summed over the batches ``rows_of`` after the first ``n_warm``."""
    from slide.kernels.arrays import Store
    from slide.network import block as BK
    from slide.network import extras as EX
    T = {}

    def tick(k, t0):
        t1 = time.perf_counter()
        T[k] = T.get(k, 0.0) + t1 - t0
        return t1

    for b, rows in enumerate(rows_of):
        if b == n_warm:
            T.clear()
        serial = serial0 + b
        sc, blk = net.sc, net.block
        t = time.perf_counter()
        frows = BK._feature_rows(net, X, rows) if net.fused_first else \
            BK._NO_FEATURE_ROWS
        # the draw (made ahead, or beside the first layer's listing: --draw-ahead)
        shared, frows_left = BK._draw(net, 0, serial, Xc, rows, frows)
        neg = net.negatives.bundle(shared)
        ns = shared.shape[0]
        H, losses = net.store.h_store[:128], net.losses[:128]
        t = tick("draw (and listing)", t)
        with BK._parallel_chunks(128):
            BK.block_forward(net.params, net.spec, net.tables, sc, blk, Xc, Yc, rows,
                             np.uint64(0), np.int64(serial), shared, shared[:0], H, losses,
                             frows_left)
        t = tick("forward (per sample)", t)
        WS, bS = blk.WS[:ns], blk.bS[:ns]
        Z = blk.Z.reshape(-1)[:128 * ns].reshape(128, ns)
        xt = EX.extras_bundle(net, 128, H, net.store.d_store[:128])
        with BK._one_task_a_chunk():
            BK.split_forward_product(xt, shared, WS, bS, Z, BK.product_parts(ns))
        t = tick("gather W_S, Z = H W_S^T", t)
        with BK._parallel_chunks(128):
            BK.block_loss(net.params, net.spec, sc, blk, Yc, rows, neg, Z,
                          BK.block_offsets(bS, shared, neg), xt, losses,
                          np.float32(1 / 128), net.correct, net.loss_marker)
        t = tick("corrected softmax", t)
        dH = blk.dH[:128]
        with BK._one_task_a_chunk():
            BK.split_backward_products(Z, WS, xt, dH, blk.dWS[:ns], blk.dbS[:ns],
                                       BK.product_parts(ns))
        t = tick("dH, dW_S, db_S", t)
        with BK._parallel_chunks(128):
            BK.block_backward(net.params, net.spec, sc, blk, Xc, rows, dH, xt,
                              not net.fused_first)
        t = tick("backward (per sample)", t)
        nr, nbias = net.touched(X, rows, serial)
        t = tick("touched rows", t)
        opt.step(net.params, net.touched_rows, nr, nbias)
        if net.fused_first:
            nf = int(frows.count[0])        # listed by _draw or block_forward
            a0, a1 = int(sc.a_off[0]), int(sc.a_off[1])
            opt.step_first(net.W, frows, nf, X.data, blk.dels[:128, a0:a1])
        t = tick("hidden Adam", t)
        store = Store(net.store.h_store, net.store.d_store)
        nu = BK.output_entries(blk.extra[:128], blk.counts[:128, 2:3], 0,
                               store.d_store.shape[1], net.out_rows, np.int64(serial))
        opt.step_output(net.W, net.B, net.out_rows, nu, store)
        t = tick("extras' rows step", t)
        opt.step_block(net.W, net.B, shared, blk.dWS[:ns], blk.dbS[:ns], net.out_stamp,
                       serial)
        tick("block rows step", t)
    return T


if __name__ == "__main__":
    main()
