"""Probe (round 5): a sparse linear input->label path ("wide" path) beside the network.

    python bench/probes/probe_wide_path.py debdeps|debtags [epochs] [lr]

The trees' evidence is per-label linear weights on the tf-idf input.  A full [features x
labels] matrix is out of reach (debdeps: 47k x 26k), but the (feature, label) pairs that
co-occur in a training row are few (debdeps 5.2M, debtags 0.39M): this probe gives each such
pair one weight, trains the path alone (softmax over every label with 1/|y| targets, its
bias started at the log prior, Adagrad, HOGWILD over the batch), then reports it alone and
added to slide's blended scores (trained apart, as a second member of another kind).
"""
import glob
import sys
import time

import numpy as np
from numba import njit, prange

from slide import SlideClassifier
from slide.data import read_xc

name = sys.argv[1]
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
lr = float(sys.argv[3]) if len(sys.argv) > 3 else 0.3
base = {"debdeps": "/work/data/debdeps", "debtags": "/work/shared/data/debtags"}[name]
Xtr, Ytr = read_xc(glob.glob(base + "/train*")[0])
Xte, Yte = read_xc(glob.glob(base + "/test*")[0])
Xtr = Xtr.tocsr().astype(np.float32)
Xte = Xte.tocsr().astype(np.float32)
n, d = Xtr.shape
L = Ytr.shape[1]
S = (Xtr.T.astype(np.bool_).astype(np.float32) @ Ytr.astype(np.float32)).tocsr()
S.sort_indices()
sup_ptr, sup_lab = S.indptr.astype(np.int64), S.indices.astype(np.int32)
print(name, "support pairs", len(sup_lab), flush=True)
count = np.bincount(Ytr.indices, minlength=L).astype(np.float64)
bias0 = np.log((count + 1) / (count.sum() + L)).astype(np.float32)


@njit(parallel=True, fastmath=True, cache=True)
def train_epoch(xp, xi, xv, yp, yi, order, bsz, sup_ptr, sup_lab, V, G, b, Gb, lr, n_labels):
    nb = (len(order) + bsz - 1) // bsz
    for bt in range(nb):
        lo = bt * bsz
        hi = min(len(order), lo + bsz)
        for t in prange(hi - lo):
            r = order[lo + t]
            z = b.copy()
            for a in range(xp[r], xp[r + 1]):
                f = xi[a]
                x = xv[a]
                for q in range(sup_ptr[f], sup_ptr[f + 1]):
                    z[sup_lab[q]] += V[q] * x
            m = z.max()
            s = 0.0
            for j in range(n_labels):
                z[j] = np.exp(z[j] - m)
                s += z[j]
            for j in range(n_labels):
                z[j] /= s
            ny = yp[r + 1] - yp[r]
            for a in range(yp[r], yp[r + 1]):
                z[yi[a]] -= 1.0 / ny
            # z is now the gradient of the loss in the logits
            for a in range(xp[r], xp[r + 1]):
                f = xi[a]
                x = xv[a]
                for q in range(sup_ptr[f], sup_ptr[f + 1]):
                    g = z[sup_lab[q]] * x
                    if g != 0.0:
                        G[q] += g * g
                        V[q] -= lr * g / np.sqrt(G[q] + 1e-8)
            for j in range(n_labels):
                g = z[j]
                Gb[j] += g * g
                b[j] -= lr * 0.1 * g / np.sqrt(Gb[j] + 1e-8)


@njit(parallel=True, fastmath=True, cache=True)
def scores(xp, xi, xv, sup_ptr, sup_lab, V, b, out):
    for r in prange(out.shape[0]):
        z = out[r]
        z[:] = b
        for a in range(xp[r], xp[r + 1]):
            f = xi[a]
            x = xv[a]
            for q in range(sup_ptr[f], sup_ptr[f + 1]):
                z[sup_lab[q]] += V[q] * x


def prec(score, truth):
    top = np.argsort(-score, axis=1)[:, :5]
    hits = np.array([[j in set(truth.indices[truth.indptr[r]:truth.indptr[r + 1]].tolist())
                      for j in top[r]] for r in range(score.shape[0])])
    return hits[:, 0].mean(), hits.mean()


V = np.zeros(len(sup_lab), np.float32)
G = np.zeros_like(V)
b = bias0.copy()
Gb = np.zeros_like(b)
Ytr = Ytr.tocsr()
rng = np.random.default_rng(0)
train_epoch(Xtr.indptr, Xtr.indices, Xtr.data, Ytr.indptr, Ytr.indices, np.arange(2), 2,
            sup_ptr, sup_lab, V.copy(), G.copy(), b.copy(), Gb.copy(), np.float32(0.0), L)
t0 = time.time()
for e in range(epochs):
    train_epoch(Xtr.indptr, Xtr.indices, Xtr.data, Ytr.indptr, Ytr.indices,
                rng.permutation(n), 128, sup_ptr, sup_lab, V, G, b, Gb, np.float32(lr), L)
    print(name, "wide epoch", e + 1, round(time.time() - t0, 1), "s", flush=True)
wide_s = time.time() - t0
Z = np.empty((Xte.shape[0], L), np.float32)
scores(Xte.indptr, Xte.indices, Xte.data, sup_ptr, sup_lab, V, b, Z)
Pw = np.exp(Z - Z.max(1, keepdims=True))
Pw /= Pw.sum(1, keepdims=True)
truth = Yte.tocsr()
print(name, f"wide alone ({epochs} ep, lr {lr}, {wide_s:.1f} s)",
      "P@1 %.4f P@5 %.4f" % prec(Pw, truth), flush=True)
t0 = time.time()
m = SlideClassifier(n_threads=2, random_state=0).fit(Xtr, Ytr)
print(name, "slide fit", round(m.train_seconds_, 1), "s", flush=True)
blend = m.predict_proba(Xte)
print(name, "slide blend", "P@1 %.4f P@5 %.4f" % prec(blend, truth), flush=True)
for g in (0.25, 0.5, 1.0, 2.0):
    print(name, f"blend + {g} * wide", "P@1 %.4f P@5 %.4f" % prec(blend + g * Pw, truth),
          flush=True)
