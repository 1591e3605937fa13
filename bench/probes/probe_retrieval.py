"""Does a candidate source by the input words close the gap to the label trees on a real set?
``SlideClassifier()`` is fitted with and without the centroid index's labels among the
re-ranker's candidates (``slide.rank.centroids``; ``rerank.N_CANDIDATES`` of them a row, the
re-ranker fitted with them), seed by seed; printed per fit: the share of test rows whose
candidates hold a true label, P@1 and P@5 of ``predict_topk``, and in how many rows the first
label came from the index (and was true). Untimed (seconds for orientation only).

    python bench/probes/probe_retrieval.py --train datasets/debcontents/train.txt \
        --test datasets/debcontents/test.txt [--seeds 0,1,2] [--retrieved 50]

A last part asks the same of a *feature* instead of candidates: the vote of each row's 20
nearest training rows in the tf-idf input (pruned like the index: the row's 30 heaviest words,
each word's 200 heaviest rows) beside the re-ranker's features, the logistic regression fitted
on one half of the test rows' candidates and scored on the other half (4 random halves).
"""
import argparse
import os
import sys
import time

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _truth_mask(ptr, counts, ids, Y):
    """Per candidate slot: whether it is a true label of its row (unused slots False)."""
    out = np.zeros(ids.shape[0], bool)
    for i in range(counts.shape[0]):
        a = ptr[i]
        out[a:a + counts[i]] = np.isin(ids[a:a + counts[i]], Y.indices[Y.indptr[i]:Y.indptr[i + 1]])
    return out


def _fit_once(slide, rerank, X, Y, Xt, Yt, seed, n_retrieved):
    rerank.N_CANDIDATES = n_retrieved
    t = time.perf_counter()
    model = slide.SlideClassifier(random_state=seed, n_threads=2).fit(X, Y)
    fit_s = time.perf_counter() - t
    R = model.rank_.reranker
    H = model.network_.hidden(Xt)
    ptr, counts, ids, F = rerank.features(model._output(), Xt, H, model.rank_.memory, R.k_nn,
                                          R.centroids, rerank.N_TOP, linear=R.linear,
                                          retrieved=R.retrieve(Xt))
    truth = _truth_mask(ptr, counts, ids, Yt)
    recall = np.mean([truth[ptr[i]:ptr[i] + counts[i]].any() for i in range(Xt.shape[0])])
    top = model.predict_topk(Xt, k=5)
    hit = _truth_mask(np.arange(0, top.size, 5), np.full(top.shape[0], 5), top.ravel(), Yt)
    hit = hit.reshape(top.shape)
    from_index = 0
    from_index_true = 0
    if n_retrieved:
        base_ptr, base_n, _, _ = rerank.features(model._output(), Xt, H, model.rank_.memory,
                                                 R.k_nn, R.centroids, rerank.N_TOP,
                                                 linear=R.linear)
        for i in range(Xt.shape[0]):
            c = ids[ptr[i]:ptr[i] + counts[i]]
            first = int(np.nonzero(c == top[i, 0])[0][0])
            if first >= base_n[i]:
                from_index += 1
                from_index_true += bool(hit[i, 0])
    print(f"| {seed} | {n_retrieved} | {fit_s:.1f} | {counts.mean():.1f} | {recall:.4f} | "
          f"{hit[:, 0].mean():.4f} | {hit.mean():.4f} | {from_index} ({from_index_true} true) |",
          flush=True)
    return model, ptr, counts, ids, F, truth


def _prune(M, per, axis):
    """M with each row's (axis=1) or column's (axis=0) ``per`` largest entries kept (CSR)."""
    M = sp.csr_matrix(M) if axis == 1 else sp.csc_matrix(M)
    keep = np.zeros(M.data.shape[0], bool)
    for r in range(M.shape[0] if axis == 1 else M.shape[1]):
        a, b = M.indptr[r], M.indptr[r + 1]
        keep[a + np.argsort(-M.data[a:b], kind="stable")[:per]] = True
    major = np.repeat(np.arange(M.indptr.shape[0] - 1), np.diff(M.indptr))
    rows, cols = (major, M.indices) if axis == 1 else (M.indices, major)
    return sp.csr_matrix((M.data[keep], (rows[keep], cols[keep])), shape=M.shape)


def _input_vote(X, Y, Xt, ptr, counts, ids, k=20, terms=30, per_feature=200, power=4):
    """[slots, 2]: each candidate's vote and share among the row's k nearest training rows
    by pruned tf-idf cosine."""
    S = (_prune(Xt, terms, 1) @ _prune(X, per_feature, 0).T).tocsr()
    out = np.zeros((ids.shape[0], 2))
    for i in range(Xt.shape[0]):
        a, b = S.indptr[i], S.indptr[i + 1]
        order = np.argsort(-S.data[a:b], kind="stable")[:k]
        near, sims = S.indices[a:b][order], S.data[a:b][order]
        w = sims ** power
        w /= max(w.sum(), 1e-12)
        vote, share = {}, {}
        for r, wr in zip(near, w):
            for j in Y.indices[Y.indptr[r]:Y.indptr[r + 1]]:
                vote[j] = vote.get(j, 0.0) + wr
                share[j] = share.get(j, 0.0) + 1.0 / k
        for u in range(ptr[i], ptr[i] + counts[i]):
            out[u] = vote.get(ids[u], 0.0), share.get(ids[u], 0.0)
    return out


def _half_split_p1(F, truth, ptr, counts, n, rng):
    """P@1 on a random half of the rows of a logistic regression fitted on the other half."""
    from slide.rank.logistic import expand, newton_logistic
    row = np.repeat(np.arange(n), np.diff(ptr))
    used = (np.arange(ptr[-1]) - ptr[row]) < counts[row]
    in_a = np.zeros(n, bool)
    in_a[rng.permutation(n)[:n // 2]] = True
    fit, held = used & in_a[row], used & ~in_a[row]
    mean, scale = F[fit].mean(0), F[fit].std(0)
    scale[scale == 0] = 1.0
    w = newton_logistic((F[fit] - mean) / scale, truth[fit], 1.0)
    s = np.full(ptr[-1], -np.inf)
    s[held] = expand((F[held] - mean) / scale) @ w[:-1] + w[-1]
    return float(np.mean([truth[ptr[i] + np.argmax(s[ptr[i]:ptr[i] + counts[i]])]
                          for i in np.nonzero(~in_a)[0]]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--retrieved", type=int, default=50)
    args = ap.parse_args()
    import slide
    from bench.common import git_commit
    from slide.rank import rerank
    X, Y = slide.read_xc(args.train)
    Xt, Yt = slide.read_xc(args.test)
    X, Y, Xt, Yt = X.tocsr(), Y.tocsr(), Xt.tocsr(), Yt.tocsr()
    Xt.sort_indices()
    print(f"commit {git_commit()}; {args.train}: {X.shape[0]} rows, {Y.shape[1]} labels; "
          f"test {Xt.shape[0]} rows")
    print("| seed | labels retrieved a row | fit s | candidates a row | rows with a true "
          "candidate | P@1 | P@5 | rows whose first label the index found |")
    print("|---|---|---|---|---|---|---|---|")
    base = None
    for seed in [int(s) for s in args.seeds.split(",")]:
        for n_retrieved in (0, args.retrieved):
            got = _fit_once(slide, rerank, X, Y, Xt, Yt, seed, n_retrieved)
            if base is None and n_retrieved == 0:
                base = got
    _, ptr, counts, ids, F, truth = base
    t = time.perf_counter()
    extra = _input_vote(X, Y, Xt, ptr, counts, ids)
    print(f"\ninput-space vote as a re-ranker feature (first seed's candidates; "
          f"{time.perf_counter() - t:.1f} s to compute), P@1 over 4 random halves:")
    for name, FF in (("the re-ranker's features", F), ("+ input-space vote", np.hstack([F, extra]))):
        rng = np.random.default_rng(0)
        p1 = [_half_split_p1(FF, truth, ptr, counts, Xt.shape[0], rng) for _ in range(4)]
        print(f"  {name}: {np.mean(p1):.4f} ({', '.join(f'{p:.4f}' for p in p1)})")


if __name__ == "__main__":
    main()
