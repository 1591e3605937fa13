"""Head labels' one-vs-rest classifiers in the re-ranker's linear_score: paired on one network.

The hashed per-label classifiers (``slide.rank.linear.LabelLinear``) train each label against
the rows' hard negatives only. Omikuji's first labels with 100+ training rows are right more
often than slide's on debcontents (``tree_disagreement_debcontents_fe2a1c2.md``), and a tree's
classifiers see every row that reaches their node. Here the labels with at least ``T`` training
rows (the head) also get a ``OneVsRest`` classifier trained on every fitting row (each such label
against every other row); a candidate of the head takes its score from it instead of from the
hashed table, the others keep theirs; or (``--into FEATURE``) the head's score goes into another
feature's column, 0 for the other labels, as a scratch twelfth feature (that column's own
feature is lost; ``--thresholds 0`` only zeroes the column, to tell the two apart).
``SlideClassifier()`` is fitted once and its
ranking stages refitted per setting on the same network and split, as
``probe_rank_levers.py`` does.

    python bench/probes/probe_head_ovr.py --train datasets/debcontents/train.txt \
        --test datasets/debcontents/test.txt --thresholds 300,100,50 [--seed 0]
"""
import argparse
import os
import sys
import time

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class HeadAndHashed:
    """``base``'s scores, but the head labels' from ``ovr`` (fitted on the head's columns)."""

    def __init__(self, base, ovr, head_of, into=None):
        self.base, self.ovr, self.head_of, self.into = base, ovr, head_of, into

    def score_into(self, X, cand_ptr, counts, ids, F, col):
        self.base.score_into(X, cand_ptr, counts, ids, F, col)
        if self.into is not None:           # the head's score in another feature's column,
            col = self.into                 # 0 for the other labels
            F[:, col] = 0.0
        safe = np.where(ids >= 0, ids, 0)
        head_ids = self.head_of[safe]
        tmp = np.zeros((F.shape[0], 1), np.float32)
        if self.ovr is None:
            return
        self.ovr.score_into(X, cand_ptr, counts, np.maximum(head_ids, 0).astype(ids.dtype),
                            tmp, 0)
        from slide.rank.rerank import _used
        take = _used(cand_ptr, counts)[0] & (ids >= 0) & (head_ids >= 0)
        F[take, col] = tmp[take, 0]

    def state(self):
        return self.base.state()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--thresholds", default="300,100,50", help="T: the head is the labels "
                    "with at least T fitting rows; 0: no head (with --into: the column zeroed)")
    ap.add_argument("--into", default="", help="comma list of features (rerank.FEATURES) whose "
                    "column takes the head's score instead of linear_score (a scratch "
                    "twelfth feature: the column's own feature is lost)")
    args = ap.parse_args()
    import slide.rank.rerank as rr
    from slide.rank.linear import OneVsRest
    from bench.probes.probe_rank_levers import fitted, refit
    model, Xc, Yc, split, Xt, Yt = fitted(args.train, args.test, args.seed)
    original = rr.fit_classifiers
    refit(model, Xc, Yc, split, Xt, Yt, "defaults", [])
    intos = [None] + [rr.FEATURES.index(f) for f in args.into.split(",") if f]
    for t, into in [(int(v), c) for v in args.thresholds.split(",") for c in intos]:
        def hybrid(output, H, X_, Y_, rows, seed=0, n_neighbours=0, t=t, into=into):
            base = original(output, H, X_, Y_, rows, seed, n_neighbours)
            Yr = Y_[np.asarray(rows, np.int64)]
            counts = np.bincount(Yr.indices, minlength=Y_.shape[1])
            head = np.flatnonzero(counts >= t) if t > 0 else np.zeros(0, np.int64)
            head_of = np.full(Y_.shape[1], -1, np.int64)
            if head.shape[0] == 0:          # T = 0: only the column's own feature dropped
                print("  [no head: the column zeroed]", flush=True)
                return HeadAndHashed(base, None, head_of, into)
            head_of = np.full(Y_.shape[1], -1, np.int64)
            head_of[head] = np.arange(head.shape[0])
            Yh = sp.csr_matrix(Y_[:, head])
            t0 = time.perf_counter()
            ovr = OneVsRest.fit(X_, Yh, rows, seed)
            print(f"  [head >= {t}: {head.shape[0]} labels, one-vs-rest fit "
                  f"{time.perf_counter() - t0:.1f} s]", flush=True)
            return HeadAndHashed(base, ovr, head_of, into)
        rr.fit_classifiers = hybrid
        where = "linear_score" if into is None else f"{rr.FEATURES[into]}'s column"
        try:
            refit(model, Xc, Yc, split, Xt, Yt, f"head >= {t}: one-vs-rest in {where}", [])
        finally:
            rr.fit_classifiers = original
    refit(model, Xc, Yc, split, Xt, Yt, "defaults, again", [])


if __name__ == "__main__":
    main()
