"""What a sample's active-set bookkeeping costs in the batched engine, one thread, no
network: the exact head joined to its labels (``negatives.sorted_union``), the active set
[C | S minus C] (``sample._random_active``) and each id's column in S
(``block._active_columns``), for ``--rows`` random rows of an XC file, S = the ``--head``
most frequent labels plus ``--drawn`` others drawn without replacement in proportion to
count + 1 (the defaults' block: 512 + 512). Prints microseconds a sample for each stage added
(best of ``--repeat``); the softmax's own walk over C is not included.

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
    args = ap.parse_args()
    from numba import njit

    import slide
    from slide.kernels.negatives import sorted_union
    from slide.kernels.sample import _random_active
    from slide.network.block import _active_columns

    @njit(nogil=True, error_model="numpy")
    def bookkeeping(Yp, Yi, rows, exact, S, mark, out, col, extra, pos, forced, stage, base):
        total = 0
        for s in range(rows.shape[0]):
            labels = Yi[Yp[rows[s]]:Yp[rows[s] + 1]]
            lab = sorted_union(labels, exact, forced)
            if stage == 0:
                total += lab.shape[0]
                continue
            n, _, n_c, n_s = _random_active(mark.shape[0], lab, S, 0, np.uint64(1), out, mark,
                                            base + s + 1, pos)
            total += n
            if stage == 2:
                total += _active_columns(out[:n], n_c, n_s, S, col, extra, pos)
        return total

    _, Y = slide.read_xc(args.data)[:2]
    Y = Y.tocsr()
    Y.sort_indices()
    freq = np.asarray(Y.sum(0)).ravel()
    order = np.argsort(-freq, kind="stable")
    rng = np.random.default_rng(0)
    exact = np.sort(order[:args.head]).astype(np.int64)
    p = freq[order[args.head:]] + 1.0
    drawn = rng.choice(order[args.head:], args.drawn, replace=False, p=p / p.sum())
    S = np.sort(np.concatenate([exact, drawn])).astype(np.int64)
    Yp, Yi = Y.indptr.astype(np.int64), Y.indices.astype(np.int64)
    rows = rng.permutation(Y.shape[0])[:args.rows].astype(np.int64)
    cap = int(np.diff(Yp).max()) + S.shape[0] + 1
    mark = np.zeros(Y.shape[1], np.int64)
    out, col, extra, pos, forced = (np.zeros(cap, np.int64), np.zeros(cap, np.int32),
                                    np.zeros(cap, np.int32), np.zeros(cap, np.int32),
                                    np.zeros(cap, np.int64))
    print(f"{args.data}: {Y.shape[1]:,} labels, |S| = {S.shape[0]}, {args.rows} rows, "
          f"mean |C| {np.mean([len(set(Yi[Yp[r]:Yp[r + 1]]) | set(exact)) for r in rows]):.0f}")
    names = ["head joined to the labels", "+ the active set", "+ the columns"]
    for stage, name in enumerate(names):
        bookkeeping(Yp, Yi, rows[:4], exact, S, mark, out, col, extra, pos, forced, stage, 10**9)
        best = np.inf
        for rep in range(args.repeat):
            t0 = time.perf_counter()
            bookkeeping(Yp, Yi, rows, exact, S, mark, out, col, extra, pos, forced, stage,
                        (stage * args.repeat + rep) * 10**7)
            best = min(best, time.perf_counter() - t0)
        print(f"{name:28s} {best / args.rows * 1e6:6.2f} us a sample")


if __name__ == "__main__":
    main()
