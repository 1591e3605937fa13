"""What a sample's active-set bookkeeping costs in the batched engine, one thread, no
network: the active set [C | S minus C] (``sample._random_active``; C = the sample's labels)
and each id's column in S (``block._active_columns``), for ``--rows`` random rows of an XC
file, S = the ``--head`` most frequent labels plus ``--drawn`` others drawn without
replacement in proportion to count + 1 (the defaults' block: 512 + 512). Prints microseconds
a sample for each stage added (best of ``--repeat``), over all rows and over the rows with
``--many`` labels or more (debcontents' tail: one row in a hundred has 500+); the softmax's
own walks over C are not included.

    python bench/probes/probe_bookkeeping.py --data datasets/debcontents/train.txt
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--rows", type=int, default=6400)
    ap.add_argument("--head", type=int, default=512)
    ap.add_argument("--drawn", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--many", type=int, default=500)
    args = ap.parse_args()
    from numba import njit

    import slide
    from slide.kernels.sample import _random_active
    from slide.network.block import _active_columns

    @njit(nogil=True, error_model="numpy")
    def bookkeeping(Yp, Yi, rows, S, mark, out, col, extra, pos, stage, base):
        total = 0
        for s in range(rows.shape[0]):
            labels = Yi[Yp[rows[s]]:Yp[rows[s] + 1]]
            n, _, n_c, n_s = _random_active(mark.shape[0], labels, S, 0, np.uint64(1), out,
                                            mark, base + s + 1, pos, True)
            total += n
            if stage == 1:
                total += _active_columns(out[:n], n_c, n_s, S, col, extra, pos, False)
        return total

    _, Y = slide.read_xc(args.data)[:2]
    Y = Y.tocsr()
    Y.sort_indices()
    freq = np.asarray(Y.sum(0)).ravel()
    order = np.argsort(-freq, kind="stable")
    rng = np.random.default_rng(0)
    exact = np.sort(order[:args.head]).astype(np.int64)       # in S, not in C
    p = freq[order[args.head:]] + 1.0
    drawn = rng.choice(order[args.head:], args.drawn, replace=False, p=p / p.sum())
    S = np.sort(np.concatenate([exact, drawn])).astype(np.int64)
    Yp, Yi = Y.indptr.astype(np.int64), Y.indices.astype(np.int64)
    rows = rng.permutation(Y.shape[0])[:args.rows].astype(np.int64)
    cap = int(np.diff(Yp).max()) + S.shape[0] + 1
    mark = np.zeros(Y.shape[1], np.int64)
    out, col, extra, pos = (np.zeros(cap, np.int64), np.zeros(cap, np.int32),
                            np.zeros(cap, np.int32), np.zeros(cap, np.int32))
    n_lab = np.diff(Yp)[rows]
    many = rows[n_lab >= args.many]
    print(f"{args.data}: {Y.shape[1]:,} labels, |S| = {S.shape[0]}, {args.rows} rows "
          f"(mean {n_lab.mean():.1f} labels), {many.shape[0]} of them with {args.many}+ labels")
    for stage, name in enumerate(["the active set", "+ the columns"]):
        for label, part in (("all rows", rows), (f"{args.many}+ labels", many)):
            if part.shape[0] == 0:
                continue
            bookkeeping(Yp, Yi, part[:4], S, mark, out, col, extra, pos, stage, 10**9)
            best = np.inf
            for rep in range(args.repeat):
                t0 = time.perf_counter()
                bookkeeping(Yp, Yi, part, S, mark, out, col, extra, pos, stage,
                            (stage * args.repeat + rep) * 10**7)
                best = min(best, time.perf_counter() - t0)
            print(f"{name:16s} {label:14s} {best / part.shape[0] * 1e6:8.2f} us a sample")


if __name__ == "__main__":
    main()
