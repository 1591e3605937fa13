"""Probe (round 7): dump the re-ranker's candidates with their features, for offline study of
other features and learners without refitting the network.

    python bench/probes/probe_rerank_dump.py debdeps|debtags SEED OUT.npz

Fits ``SlideClassifier(random_state=SEED)`` (defaults: the re-ranker on) on the training set,
then recomputes exactly what ``slide.rank.rerank.fit_reranker`` fits on (the held-out rows'
candidates, memory without the held-out rows, centroids and counts of the fitting rows) and
what ``predict_topk`` ranks (the test rows' candidates). Saves per candidate: its features,
whether it is a true label, its row and label id; per test row: its number of true labels;
plus the unpruned centroid cosine (``CENTROID_TERMS`` raised to 4,096) for both.
"""
import glob
import sys
import time

import numpy as np
import scipy.sparse as sp

from slide import SlideClassifier
from slide.rank import rerank
from slide.data import read_xc

name, seed, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
base = {"debdeps": "/work/data/debdeps", "debtags": "/work/shared/data/debtags"}[name]
X, Y = read_xc(glob.glob(base + "/train*")[0])
Xte, Yte = read_xc(glob.glob(base + "/test*")[0])
t0 = time.time()
m = SlideClassifier(random_state=seed).fit(X, Y)
print("fit", round(time.time() - t0, 1), "s; train_seconds", round(m.train_seconds_, 1))
net, memory, rr = m.network_, m.rank_.memory, m.rank_.reranker
fit_rows, held_rows = m._rerank_split(X.shape[0], Y.shape[1])
X = sp.csr_matrix(X)
X.sort_indices()
Xte = sp.csr_matrix(Xte)
Xte.sort_indices()


def pairs_cosine(Xr, C, rows, labels, block=200_000):
    """cosine-ish dot of input row rows[i] (L2 normalised) with centroid labels[i]."""
    nr = np.sqrt(np.asarray(Xr.multiply(Xr).sum(1)).ravel())
    nr[nr == 0] = 1
    out = np.empty(rows.shape[0])
    for a in range(0, rows.shape[0], block):
        b = min(rows.shape[0], a + block)
        out[a:b] = np.asarray(Xr[rows[a:b]].multiply(C[labels[a:b]]).sum(1)).ravel()
    return out / nr[rows]


def full_centroids(Xr, Yr):
    C = (sp.csr_matrix(Yr, dtype=np.float64).T @ Xr).tocsr()
    nr = np.sqrt(np.asarray(C.multiply(C).sum(1)).ravel())
    nr[nr == 0] = 1
    return (sp.diags(1 / nr) @ C).tocsr()


def dump(Xr, Yr, H, cen, exclude, log_count, C_full):
    cand_ptr, counts, ids, F = rerank.features(net.output_layer(), Xr, H, memory, rr.k_nn, cen, rerank.N_TOP,
                                               exclude=exclude, log_count=log_count,
                                               linear=rr.linear)
    used, slot_row = rerank._used(cand_ptr, counts)
    rows, labs = slot_row[used].astype(np.int64), ids[used]
    Yr = sp.csr_matrix(Yr)
    truth = np.asarray(Yr[rows, labs]).ravel() > 0
    cos_full = pairs_cosine(Xr, C_full, rows, labs)
    return F[used], truth, rows, labs, cos_full


Y_fit = sp.csr_matrix(Y).copy()
Y_fit.data[~np.repeat(np.isin(np.arange(Y.shape[0]), fit_rows), np.diff(Y_fit.indptr))] = 0
Y_fit.eliminate_zeros()
cen_fit = rerank.label_centroids(X, Y_fit, rerank.centroid_terms(Y.shape[1]))
lc_fit = np.log1p(np.bincount(Y_fit.indices, minlength=Y.shape[1]).astype(np.float64))
Xh = X[held_rows]
Hh = net.hidden(Xh)
Fh, th, rh, lh, ch = dump(Xh, Y[held_rows], Hh, cen_fit, held_rows, lc_fit,
                          full_centroids(X, Y_fit))
Ht = net.hidden(Xte)
Ft, tt, rt, lt, ct = dump(Xte, Yte, Ht, rr.centroids, None, None, full_centroids(X, Y))
pred = m.predict_topk(Xte, 5)
ids = pred[0] if isinstance(pred, tuple) else pred
Yte = sp.csr_matrix(Yte)
p1 = float(np.mean(np.asarray(Yte[np.arange(Xte.shape[0]), ids[:, 0]]).ravel() > 0))
print("model P@1", round(p1, 4))
np.savez_compressed(out, Fh=Fh, th=th, rh=rh, lh=lh, ch=ch, Ft=Ft, tt=tt, rt=rt, lt=lt, ct=ct,
                    nte=np.diff(sp.csr_matrix(Yte).indptr), p1=p1,
                    y_fit_counts=np.bincount(Y_fit.indices, minlength=Y.shape[1]))
print("saved", out, Fh.shape, Ft.shape)
