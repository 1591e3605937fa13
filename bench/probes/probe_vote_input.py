"""Probe (round 5): does the trees' kind of evidence -- the tf-idf input itself -- add to the
neighbour vote?  One seed, default SlideClassifier trained on the whole training file.

    python bench/probes/probe_vote_input.py debdeps|debtags [test rows]

(debdeps was run on its first 4,000 test rows: the process grew by ~1 GB per block of 500
rows, from scipy's sparse products it seems, and 23 GB ran out before the end.)

Scores compared on the test file (P@1, P@5), all dense over every label:
  blend      (1 - w) softmax + w vote, the vote over the hidden layer (slide's default);
  mixsim a   the vote's similarity (1 - a) cos(hidden) + a cos(tf-idf input);
  +cent b    the blend plus b * cos(tf-idf input, the label's tf-idf centroid).
"""
import glob
import sys
import time

import numpy as np
import scipy.sparse as sp

from slide import SlideClassifier
from slide.data import read_xc
from slide.kernels.topk import fold_topk
from slide.rank.vote import POWER, _l2_rows

name = sys.argv[1]
base = {"debdeps": "/work/data/debdeps", "debtags": "/work/shared/data/debtags"}[name]
Xtr, Ytr = read_xc(glob.glob(base + "/train*")[0])
Xte, Yte = read_xc(glob.glob(base + "/test*")[0])
if len(sys.argv) > 2:
    Xte, Yte = Xte[:int(sys.argv[2])], Yte[:int(sys.argv[2])]
K, W = 20, 0.85
t0 = time.time()
m = SlideClassifier(n_threads=2, random_state=0).fit(Xtr, Ytr)
print(name, "fit", round(time.time() - t0, 1), "s", flush=True)
net = m.network_
Emb = _l2_rows(net.hidden(Xtr))
Q = _l2_rows(net.hidden(Xte))
S = m.predict_scores(Xte).astype(np.float32)
P = np.exp(S - S.max(1, keepdims=True))
P /= P.sum(1, keepdims=True)
Xtr_c, Xte_c = Xtr.tocsr().astype(np.float32), Xte.tocsr().astype(np.float32)
C = (Ytr.T.astype(np.float32) @ Xtr_c).tocsr()
nr = np.sqrt(np.asarray(C.multiply(C).sum(1)).ravel())
nr[nr == 0] = 1
C = (sp.diags((1 / nr).astype(np.float32)) @ C).tocsr()
Ycsr = Ytr.tocsr().astype(np.float32)
n, L = Xte.shape[0], Ytr.shape[1]
truth = Yte.tocsr()


def prec(top, k=5):
    hits = np.zeros((top.shape[0], k))
    for r in range(top.shape[0]):
        t = set(truth.indices[truth.indptr[r]:truth.indptr[r + 1]].tolist())
        hits[r] = [j in t for j in top[r]]
    return hits[:, 0].mean(), hits.mean()


def vote(sim):
    near = np.full((sim.shape[0], K), -1, np.int64)
    sims = np.full((sim.shape[0], K), -np.inf, np.float32)
    fold_topk(np.ascontiguousarray(sim, dtype=np.float32), 0, K, near, sims)
    w = np.maximum(sims, 0) ** POWER
    w /= np.maximum(w.sum(1, keepdims=True), 1e-30)
    A = sp.csr_matrix((w.ravel(), near.ravel(), np.arange(0, w.size + 1, K)),
                      shape=(sim.shape[0], Xtr.shape[0]))
    return (A @ Ycsr).toarray()


results = {}
B = 500     # the tf-idf similarity of a block to every training row is a sparse product
for a0 in range(0, n, B):
    sl = slice(a0, min(n, a0 + B))
    simh = Q[sl] @ Emb.T
    simx = (Xtr_c @ Xte_c[sl].T).T.toarray()
    cent = (Xte_c[sl] @ C.T).toarray()
    p = P[sl]
    for a in (0.0, 0.1, 0.2, 0.35, 0.5):
        v = vote((1 - a) * simh + a * simx)
        for b in ((0.0, 0.05, 0.1, 0.2) if a in (0.0, 0.2) else (0.0,)):
            sc = (1 - W) * p + W * v + b * cent
            # keep each block's top 5 only: the dense scores of every setting would not fit
            results.setdefault((a, b), []).append(np.argsort(-sc, axis=1)[:, :5])
    print(a0, flush=True)
for (a, b), parts in sorted(results.items()):
    p1, p5 = prec(np.vstack(parts))
    print(f"{name} mixsim a={a:.2f} cent b={b:.2f}: P@1 {p1:.4f} P@5 {p5:.4f}", flush=True)
