"""Is the re-ranker's learner or its features the limit? ``SlideClassifier()`` is fitted once;
the held-out candidates' features it fitted its logistic regression on and the test rows'
candidates it ranks are captured, then scikit-learn's HistGradientBoostingClassifier is fitted
on the same held-out features and ranks the same test candidates. Printed: P@1 and P@5 of the
logistic regression (the model's own ranking) and of each boosted setting, with its fit and
prediction seconds.

    python bench/probes/probe_rerank_learner.py --train datasets/debcontents/train.txt \\
        --test datasets/debcontents/test.txt [--seed 0]
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def precision_at(scores, row, truth, n_rows, k):
    """P@k of ranking each row's candidates (``row``: the row of each) by ``scores``."""
    order = np.lexsort((-scores, row))
    r_sorted = row[order]
    starts = np.searchsorted(r_sorted, np.arange(n_rows))
    ends = np.searchsorted(r_sorted, np.arange(n_rows), side="right")
    hits = sum(int(truth[order[a:min(b, a + k)]].sum()) for a, b in zip(starts, ends))
    return hits / (n_rows * k)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import slide
    from sklearn.ensemble import HistGradientBoostingClassifier
    from bench.common import git_commit
    from slide.rank import rerank
    X, Y = slide.read_xc(args.train)
    Xt, Yt = slide.read_xc(args.test)
    Yt = Yt.tocsr()
    held, tested = {}, []
    real_fit, real_features = rerank.ReRanker.fit_weights, rerank.features

    def fit_weights(F, truth, seed=0):
        held["F"], held["truth"] = F.copy(), truth.copy()
        return real_fit(F, truth, seed)

    def features(*a, **kw):
        out = real_features(*a, **kw)
        if held.get("testing"):
            tested.append(out)
        return out
    rerank.ReRanker.fit_weights = staticmethod(fit_weights)
    rerank.features = features
    model = slide.SlideClassifier(random_state=args.seed, n_threads=2).fit(X, Y)
    held["testing"] = True
    model.predict_topk(Xt, k=5)
    F_t, ids_t, row_t, r0 = [], [], [], 0
    for cand_ptr, counts, ids, F in tested:
        used, slot_row = rerank._used(cand_ptr, counts)
        F_t.append(F[used])
        ids_t.append(ids[used])
        row_t.append(slot_row[used] + r0)
        r0 += counts.shape[0]
    F_t, ids_t, row_t = np.concatenate(F_t), np.concatenate(ids_t), np.concatenate(row_t)
    n = Yt.shape[0]
    keys = np.repeat(np.arange(n), np.diff(Yt.indptr)).astype(np.int64) * Yt.shape[1] \
        + Yt.indices
    truth_t = np.isin(row_t.astype(np.int64) * Yt.shape[1] + ids_t, keys)
    rr = model.rank_.reranker
    print(f"commit {git_commit()}; {args.train}: seed {args.seed}; held-out candidates "
          f"{held['F'].shape[0]:,} ({held['truth'].mean():.3f} true); test rows {n:,}, "
          f"candidates {F_t.shape[0]:,}\n")
    print("| learner | fit s | predict s | P@1 | P@5 |\n|---|---|---|---|---|")
    s = rr.score(F_t)
    print(f"| logistic regression (the model's) | | | "
          f"{precision_at(s, row_t, truth_t, n, 1):.4f} | "
          f"{precision_at(s, row_t, truth_t, n, 5):.4f} |", flush=True)
    for it, lr, leaves in [(100, 0.1, 31), (200, 0.1, 31), (300, 0.05, 63)]:
        t = time.perf_counter()
        gb = HistGradientBoostingClassifier(max_iter=it, learning_rate=lr, max_leaf_nodes=leaves,
                                            early_stopping=False, random_state=0)
        gb.fit(held["F"], held["truth"])
        fit_s = time.perf_counter() - t
        t = time.perf_counter()
        s = gb.decision_function(F_t)
        pred_s = time.perf_counter() - t
        print(f"| boosted trees: {it} iterations, rate {lr}, {leaves} leaves | {fit_s:.1f} | "
              f"{pred_s:.1f} | {precision_at(s, row_t, truth_t, n, 1):.4f} | "
              f"{precision_at(s, row_t, truth_t, n, 5):.4f} |", flush=True)


if __name__ == "__main__":
    main()
