"""Probe (round 7): per-label linear classifiers over the tf-idf input, trained on hard
negatives (the network's top labels of each training row), as one more re-ranker feature.

    python bench/probes/probe_rerank_linear.py debdeps|debtags SEED DUMP.npz \
        '[[T, BITS, EPOCHS, LR], ...]'

What the label trees have and the network lacks is a linear classifier per label over the
input words that learned which words argue against the label among the labels confused with
it (Slice, Jain et al. 2019: per-label linear classifiers on a shortlist of hard negatives).
Here: one weight per hashed (feature, label) pair (2^BITS of them) and a bias per label,
logistic loss on each fitting row's true labels and its network top T (hard negatives),
Adagrad, HOGWILD over rows. Fitted on the re-ranker's fitting rows only; its score of the
held-out and test candidates is saved beside the dump of probe_rerank_dump.py (same columns).
"""
import glob
import json
import sys
import time

import numpy as np
import scipy.sparse as sp
from numba import njit, prange

from slide import SlideClassifier
from slide.data import read_xc
from slide.kernels.topk import topk_lse_of_logits
from slide.rank.linear import _slot as slot   # the hash slide.rank.linear was built with

name, seed, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
CONFIGS = json.loads(sys.argv[4]) if len(sys.argv) > 4 else [[20, 24, 5, 0.2]]
base = {"debdeps": "/work/data/debdeps", "debtags": "/work/shared/data/debtags"}[name]
X, Y = read_xc(glob.glob(base + "/train*")[0])
Xte, Yte = read_xc(glob.glob(base + "/test*")[0])


def l2(A):
    A = sp.csr_matrix(A, dtype=np.float32)
    nr = np.sqrt(np.asarray(A.multiply(A).sum(1)).ravel())
    nr[nr == 0] = 1
    A = (sp.diags(1 / nr) @ A).tocsr().astype(np.float32)
    A.sort_indices()
    return A


@njit(cache=True)
def score(x_ptr, x_ind, x_dat, r, j, W, b, mask):
    s = b[j]
    for p in range(x_ptr[r], x_ptr[r + 1]):
        s += x_dat[p] * W[slot(x_ind[p], j, mask)]
    return s


@njit(cache=True, parallel=True)
def train_epoch(x_ptr, x_ind, x_dat, rows, c_ptr, c_ids, c_y, W, G, b, gb, mask, lr, order):
    for q in prange(order.shape[0]):
        i = order[q]
        r = rows[i]
        for u in range(c_ptr[i], c_ptr[i + 1]):
            j = c_ids[u]
            s = score(x_ptr, x_ind, x_dat, r, j, W, b, mask)
            g = 1.0 / (1.0 + np.exp(-s)) - c_y[u]
            gb[j] += g * g
            b[j] -= lr * g / np.sqrt(gb[j] + 1e-8)
            for p in range(x_ptr[r], x_ptr[r + 1]):
                h = slot(x_ind[p], j, mask)
                gg = g * x_dat[p]
                G[h] += gg * gg
                W[h] -= lr * gg / np.sqrt(G[h] + 1e-8)


@njit(cache=True, parallel=True)
def score_pairs(x_ptr, x_ind, x_dat, rows, labs, W, b, mask, out):
    for u in prange(rows.shape[0]):
        out[u] = score(x_ptr, x_ind, x_dat, rows[u], labs[u], W, b, mask)


t0 = time.time()
m = SlideClassifier(random_state=seed).fit(X, Y)
print("fit", round(time.time() - t0, 1), "s", flush=True)
net = m.network_
fit_rows, held_rows = m._rerank_split(X.shape[0], Y.shape[1])
Y = sp.csr_matrix(Y)
# the fitting rows' hard negatives: the network's top T, plus their true labels
t0 = time.time()
Hf = net.hidden(X[fit_rows])
Wo, bo = net.output_view()
TMAX = max(c[0] for c in CONFIGS)
DUMP = out
parts_ids = []
for a in range(0, Hf.shape[0], 2048):
    _, top, _, _ = topk_lse_of_logits(Hf[a:a + 2048], Wo, bo, TMAX)
    parts_ids.append(top)
top = np.concatenate(parts_ids)
for config in CONFIGS:
    T, BITS, EPOCHS, LR = config[:4]
    COOC = config[4] if len(config) > 4 else 0     # co-occurrence negatives per row
    Yf = Y[fit_rows]
    Yfc = Yf.tocsc()
    crng = np.random.default_rng(1)
    c_ptr = [0]
    c_ids, c_y = [], []
    for i in range(len(fit_rows)):
        true = Yf.indices[Yf.indptr[i]:Yf.indptr[i + 1]]
        neg = np.setdiff1d(top[i, :T], true)
        if COOC:
            # the other labels of rows that share a true label: what the neighbour vote
            # proposes at prediction
            extra = []
            for _ in range(3):
                if not len(true):
                    break
                lab = true[crng.integers(len(true))]
                col = Yfc.indices[Yfc.indptr[lab]:Yfc.indptr[lab + 1]]
                r2 = col[crng.integers(len(col))]
                extra.append(Yf.indices[Yf.indptr[r2]:Yf.indptr[r2 + 1]])
            if extra:
                extra = np.setdiff1d(np.setdiff1d(np.concatenate(extra), true), neg)[:COOC]
                neg = np.concatenate([neg, extra])
        c_ids += [true, neg]
        c_y += [np.ones(len(true)), np.zeros(len(neg))]
        c_ptr.append(c_ptr[-1] + len(true) + len(neg))
    c_ptr = np.array(c_ptr, np.int64)
    c_ids = np.concatenate(c_ids).astype(np.int64)
    c_y = np.concatenate(c_y).astype(np.float32)
    print("pairs", c_ids.shape[0], "in", round(time.time() - t0, 1), "s", flush=True)
    Xn = l2(X)
    mask = (1 << BITS) - 1
    W = np.zeros(1 << BITS, np.float32)
    G = np.zeros(1 << BITS, np.float32)
    counts = np.bincount(Yf.indices, minlength=Y.shape[1]).astype(np.float64)
    prior = np.log((counts + 0.5) / (len(fit_rows) + 1.0))
    b = prior.astype(np.float32)
    gb = np.zeros(Y.shape[1], np.float32)
    rng = np.random.default_rng(seed)
    rows_arr = fit_rows.astype(np.int64)
    t0 = time.time()
    for e in range(EPOCHS):
        train_epoch(Xn.indptr.astype(np.int64), Xn.indices, Xn.data, rows_arr, c_ptr, c_ids, c_y,
                    W, G, b, gb, mask, LR, rng.permutation(len(fit_rows)))
        print("epoch", e, round(time.time() - t0, 1), "s", flush=True)

    def pair_scores(A, rows, labs):
        A = l2(A)
        o = np.empty(rows.shape[0], np.float32)
        score_pairs(A.indptr.astype(np.int64), A.indices, A.data, rows.astype(np.int64),
                    labs.astype(np.int64), W, b, mask, o)
        return o

    d = np.load(DUMP)
    out = DUMP.replace(".npz", f"_lin_T{T}_B{BITS}_E{EPOCHS}_lr{LR}_c{COOC}.npz")
    np.savez(out, sh=pair_scores(X[held_rows], d["rh"], d["lh"]),
             st=pair_scores(Xte, d["rt"], d["lt"]))
    print("saved", out)
