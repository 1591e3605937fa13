"""What debcontents' long rows cost and give: the training rows' labels capped at each of
``--caps``, side by side in one process per seed, the test set untouched. ``--mode param``
(the default): ``SlideClassifier(max_row_labels=cap)``, the network's labels cut to another
random subset each epoch, the vote and the re-ranker on every label (cap 0: no cap);
``--mode data``: the training file's Y cut once with the seed before ``fit`` (every stage
sees the cut rows; the first measurement). Either way a dropped label drawn into the batch's
shared block counts as a negative of its row. Prints, per cap and seed, the training seconds
(``train_seconds_``), the whole fit's seconds and P@1 / P@5 of ``SlideClassifier()``
(``--network-only``: the network alone, ``neighbours=0, rerank=False``) on every test row.

    python bench/probes/probe_label_cap.py --train datasets/debcontents/train.txt \\
        --test datasets/debcontents/test.txt --caps 0,256,64 --seeds 0,1,2
"""
import argparse
import os
import sys
import time

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def cap_rows(Y, cap, seed):
    """Y with each row's labels cut to a random ``cap`` of them (0: unchanged)."""
    if cap <= 0:
        return Y
    rng = np.random.default_rng(seed)
    Y = Y.tocsr()
    rows, cols = [], []
    for r in range(Y.shape[0]):
        lab = Y.indices[Y.indptr[r]:Y.indptr[r + 1]]
        if lab.shape[0] > cap:
            lab = np.sort(rng.choice(lab, cap, replace=False))
        rows.append(np.full(lab.shape[0], r))
        cols.append(lab)
    r, c = np.concatenate(rows), np.concatenate(cols)
    return sp.csr_matrix((np.ones(r.shape[0], np.float32), (r, c)), shape=Y.shape)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--caps", default="0,256,64")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--network-only", action="store_true")
    ap.add_argument("--mode", choices=("param", "data"), default="param")
    args = ap.parse_args()
    import slide
    from slide import metrics

    X, Y = slide.read_xc(args.train)[:2]
    Xt, Yt = slide.read_xc(args.test)[:2]
    extra = dict(neighbours=0, rerank=False) if args.network_only else {}
    slide.SlideClassifier(random_state=0, **extra).fit(X[:2000], Y[:2000])  # compile apart
    print(f"{args.train}: {X.shape[0]:,} rows, {Y.shape[1]:,} labels, "
          f"{int(Y.getnnz()):,} label occurrences; {'network alone' if extra else 'defaults'}, "
          f"mode {args.mode}")
    for seed in [int(s) for s in args.seeds.split(",")]:
        for cap in [int(c) for c in args.caps.split(",")]:
            if args.mode == "data":
                Yc, kw = cap_rows(Y, cap, seed), dict(max_row_labels=0)
            else:
                Yc, kw = Y, dict(max_row_labels=cap)
            model = slide.SlideClassifier(random_state=seed, **kw, **extra)
            t0 = time.perf_counter()
            model.fit(X, Yc)
            fit_s = time.perf_counter() - t0
            top = model.predict_topk(Xt, k=5)
            m = metrics.evaluate(Yt, top)
            print(f"seed {seed} cap {cap or 'none':>4}: occurrences {int(Yc.getnnz()):>9,}  "
                  f"network {model.train_seconds_:6.2f} s  fit {fit_s:6.2f} s  "
                  f"P@1 {m['P@1']:.4f}  P@5 {m['P@5']:.4f}", flush=True)


if __name__ == "__main__":
    main()
