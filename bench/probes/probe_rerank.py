"""Probe (round 4): a learned re-ranker over the neighbour vote's candidates, fitted on a
held-out slice of the training rows (never on the test set).

    python bench/probes/probe_rerank.py debdeps|debtags HOLDOUT_SHARE

The network and the neighbour memory are trained on (1 - share) of the training rows; every
held-out row's candidates (the network's top 10 and every label of its 20 nearest memory
rows) get 10 features (log-probability and probability from the network, the vote's share,
the share of neighbours carrying the label, their best similarity, the first neighbour's
rank carrying it, the label's rank in the network's top 10, the label's log training count,
the nearest neighbour's similarity, and the cosine between the row's tf-idf input and the
label's tf-idf centroid) and a HistGradientBoostingClassifier learns which are true labels.
The memory and centroids are then rebuilt over every training row and the test set is
ranked by the classifier. Python loops over rows: a probe, not an implementation.
"""
import glob  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402
from slide.data import read_xc
from slide import SlideClassifier
from slide.kernels.topk import fold_topk
from slide.rank.vote import NeighbourMemory, _l2_rows, POWER
from sklearn.ensemble import HistGradientBoostingClassifier
name = sys.argv[1]; hold = float(sys.argv[2])
base = {"debdeps": "/work/data/debdeps", "debtags": "/work/shared/data/debtags"}[name]
Xall, Yall = read_xc(glob.glob(base + "/train*")[0]); Xte, Yte = read_xc(glob.glob(base + "/test*")[0])
rng = np.random.default_rng(0); perm = rng.permutation(Xall.shape[0]); nh = int(hold * len(perm))
ih, it = np.sort(perm[:nh]), np.sort(perm[nh:])
Xtr, Ytr, Xh, Yh = Xall[it], Yall[it], Xall[ih], Yall[ih]
t0 = time.time()
m = SlideClassifier(n_threads=2, random_state=0).fit(Xtr, Ytr)
print("fit on", Xtr.shape[0], "rows", round(time.time() - t0, 1), "s; train_seconds", round(m.train_seconds_, 1))
net = m.network_
def centroids(X, Y):
    C = (Y.T.astype(np.float32) @ X).tocsr()
    nr = np.sqrt(np.asarray(C.multiply(C).sum(1)).ravel()); nr[nr == 0] = 1
    return (sp.diags(1 / nr) @ C).tocsr()
def features(mem, Cen, prior, X, Y=None, K=20, ntop=10):
    H = net.hidden(X)
    S = m.predict_scores(X).astype(np.float64)
    mx = S.max(1); lse = np.log(np.exp(S - mx[:, None]).sum(1)) + mx
    Q = _l2_rows(H); Sim = Q @ mem.emb.T
    near = np.full((H.shape[0], K), -1, np.int64); sims = np.full((H.shape[0], K), -np.inf, np.float32)
    fold_topk(Sim, 0, K, near, sims)
    top = np.argsort(-S, axis=1)[:, :ntop]
    feats, labels, groups, cands = [], [], [], []
    for r in range(H.shape[0]):
        c = {}
        for t, j in enumerate(top[r]): c.setdefault(int(j), {})["rank"] = t
        w = np.maximum(sims[r], 0) ** POWER; wsum = w.sum() or 1
        for t in range(K):
            i = near[r, t]
            for j in mem.label_ids[mem.label_indptr[i]:mem.label_indptr[i + 1]]:
                d = c.setdefault(int(j), {})
                d["vote"] = d.get("vote", 0) + w[t] / wsum
                d["count"] = d.get("count", 0) + 1
                d["maxsim"] = max(d.get("maxsim", 0), float(sims[r, t]))
                d["first"] = min(d.get("first", K), t)
        truth = set(Y.indices[Y.indptr[r]:Y.indptr[r + 1]].tolist()) if Y is not None else set()
        for j, d in c.items():
            z = S[r, j]
            feats.append([z - lse[r], np.exp(z - lse[r]), d.get("vote", 0), d.get("count", 0) / K, d.get("maxsim", 0),
                          d.get("first", K) / K, d.get("rank", ntop) / ntop, prior[j], float(sims[r, 0])])
            labels.append(j in truth); groups.append(r); cands.append(j)
    F = np.array(feats); G = np.array(groups); C = np.array(cands)
    cos = np.zeros(len(G))
    for a in range(0, len(G), 50000):
        cos[a:a+50000] = np.asarray(X[G[a:a+50000]].multiply(Cen[C[a:a+50000]]).sum(1)).ravel()
    return np.column_stack([F, cos]), np.array(labels), G, C
def p1(score, L, G, n):
    best = {}
    for g, s, l in zip(G, score, L):
        if g not in best or s > best[g][0]: best[g] = (s, l)
    return np.mean([best[g][1] if g in best else False for g in range(n)])
t0 = time.time()
mem = NeighbourMemory.build(net.hidden(Xtr), Ytr)
Cen = centroids(Xtr, Ytr); prior = np.log(np.bincount(Ytr.indices, minlength=Ytr.shape[1]) + 1.0)
Fh, Lh, Gh, _ = features(mem, Cen, prior, Xh, Yh)
gb = HistGradientBoostingClassifier(max_iter=100).fit(Fh, Lh)
print("reranker fit", round(time.time() - t0, 1), "s on", len(Fh), "candidates")
# final: memory & centroids over all training rows
mem_all = NeighbourMemory.build(net.hidden(Xall), Yall)
Cen_all = centroids(Xall, Yall); prior_all = np.log(np.bincount(Yall.indices, minlength=Yall.shape[1]) + 1.0)
t0 = time.time()
Ft, Lt, Gt, _ = features(mem_all, Cen_all, prior_all, Xte, Yte)
n = Xte.shape[0]
print("test features", round(time.time() - t0, 1), "s")
print("network alone", p1(Ft[:, 0], Lt, Gt, n))
print("fixed blend (memory of all rows)", p1(0.15 * Ft[:, 1] + 0.85 * Ft[:, 2], Lt, Gt, n))
print("gbdt reranker", p1(gb.predict_proba(Ft)[:, 1], Lt, Gt, n))
# round 5: a linear re-ranker (a weight vector: what a checkpoint could hold as an array)
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
sc = StandardScaler().fit(Fh)
for C in (0.1, 1.0):
    lr = LogisticRegression(C=C, max_iter=2000).fit(sc.transform(Fh), Lh)
    print("logistic reranker C", C, p1(lr.decision_function(sc.transform(Ft)), Lt, Gt, n))
# with the pairwise products of the features (still a weight vector)
from sklearn.preprocessing import PolynomialFeatures  # noqa: E402
poly = PolynomialFeatures(2, include_bias=False).fit(sc.transform(Fh))
Ph = poly.transform(sc.transform(Fh))
lr2 = LogisticRegression(C=1.0, max_iter=3000).fit(Ph, Lh)
print("logistic reranker, pairwise products", p1(lr2.decision_function(
    poly.transform(sc.transform(Ft))), Lt, Gt, n))
sc9 = StandardScaler().fit(Fh[:, :-1])
poly9 = PolynomialFeatures(2, include_bias=False).fit(sc9.transform(Fh[:, :-1]))
lr3 = LogisticRegression(C=1.0, max_iter=3000).fit(poly9.transform(sc9.transform(Fh[:, :-1])), Lh)
print("logistic reranker, pairwise products, without centroid cos", p1(lr3.decision_function(
    poly9.transform(sc9.transform(Ft[:, :-1]))), Lt, Gt, n))
gb2 = HistGradientBoostingClassifier(max_iter=100).fit(Fh[:, :-1], Lh)
print("gbdt reranker without centroid cos", p1(gb2.predict_proba(Ft[:, :-1])[:, 1], Lt, Gt, n))
