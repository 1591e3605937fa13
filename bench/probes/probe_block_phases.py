"""Where the time of a batched-engine batch goes: each step of ``slide.network.block`` timed on
its own, over ``--batches`` shuffled batches of a data set (after a warm-up fit that compiles
every kernel), BLAS single-threaded as in training (``--blas-threads`` to compare).

    python bench/probes/probe_block_phases.py [--data datasets/debcontents] [--batches 150]

Without ``--data``: the ``--preset`` (xc200k: 200k labels; 30,000 points). Prints milliseconds per
batch for: the shared draw (beside the first layer's listing), the per-sample forward (hidden
layers, active sets), the gather of the block's rows, the first product, the corrected
softmax, the two backward products, the per-sample backward, the touched-row listing, the
hidden layers' Adam step, the extras' row step and the block's row step; then the total and
samples/s.
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
    args = ap.parse_args()
    import slide
    from bench.common import git_commit
    from slide.network import block as BK
    from slide.kernels.arrays import Store, csr
    from threadpoolctl import threadpool_limits
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
    T = {}
    Xc, Yc = csr(X), csr(Y)
    lay = net.layout
    last = lay.n_layers - 1

    def tick(k, t0):
        t1 = time.perf_counter()
        T[k] = T.get(k, 0.0) + t1 - t0
        return t1

    n_batches = min(args.batches, X.shape[0] // 128)
    print(f"BLAS threads {args.blas_threads}, Numba threads {args.threads}")
    with threadpool_limits(args.blas_threads, user_api="blas"):
        for b in range(n_batches):
            rows = order[128 * b:128 * (b + 1)]
            serial = 1000 + b
            sc, blk = net.sc, net.block
            t = time.perf_counter()
            frows = BK._feature_rows(net, X, rows) if net.fused_first else \
                BK._NO_FEATURE_ROWS
            # the draw, beside the first layer's listing when there is one to make
            shared, frows_left = BK._draw(net, 0, serial, Xc, rows, frows)
            neg = net.negatives.bundle(shared)
            ns = shared.shape[0]
            H, losses = net.store.h_store[:128], net.losses[:128]
            t = tick("draw (and listing)", t)
            with BK._parallel_chunks():
                BK.block_forward(net.params, net.spec, net.tables, sc, blk, Xc, Yc, rows,
                                 np.uint64(0), np.int64(serial), shared, shared[:0], H, losses,
                                 frows_left)
            t = tick("forward (per sample)", t)
            WS, bS = blk.WS[:ns], blk.bS[:ns]
            BK.gather_rows(net.W, net.B, int(lay.w_off[last]), int(lay.b_off[last]),
                           int(lay.n_in[last]), shared, WS, bS)
            t = tick("gather W_S", t)
            Z = blk.Z.reshape(-1)[:128 * ns].reshape(128, ns)
            BK.split_forward_product(H, WS, Z, BK.product_parts(ns))
            t = tick("Z = H W_S^T", t)
            d_store = net.store.d_store[:128]
            with BK._parallel_chunks():
                BK.block_loss(net.params, net.spec, sc, blk, Yc, rows, neg, Z,
                              BK.block_offsets(bS, shared, neg), H, d_store, losses,
                              np.float32(1 / 128), net.correct, net.loss_marker)
            t = tick("corrected softmax", t)
            dH = blk.dH[:128]
            BK.split_backward_products(Z, WS, H, dH, blk.dWS[:ns], BK.product_parts(ns))
            np.sum(Z, axis=0, out=blk.dbS[:ns])
            t = tick("dH, dW_S products", t)
            with BK._parallel_chunks():
                BK.block_backward(net.params, net.spec, sc, blk, Xc, rows, dH, d_store,
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
    total = sum(T.values())
    for k, v in T.items():
        print(f"{k:24s} {v / n_batches * 1e3:6.2f} ms")
    print(f"{'total':24s} {total / n_batches * 1e3:6.2f} ms a batch of 128, "
          f"{128 * n_batches / total:,.0f} samples/s ({n_batches} batches)")


if __name__ == "__main__":
    main()
