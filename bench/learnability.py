"""Learnability of the synthetic presets: simple baselines' P@k on generated data.

Baselines (all exact, no training tricks):
* ``most_frequent``: always predict the k most frequent training labels;
* ``centroid``: per-label centroid (mean of the label's L2-normalised training rows),
  score = X_test @ centroids.T, top-k;
* ``knn``: cosine k-nearest-neighbours (k=10 neighbours), labels scored by summed similarity.

Usage: python bench/learnability.py tiny eurlex-4k amazon670k:n_train=50000,n_test=5000 ...
"""
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from slide.synthetic import generate
from slide.metrics import precision_at_k

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common  # noqa: E402


def topk_dense_rows(S, k):
    """Top-k column ids of each row of a dense score block, best first."""
    k = min(k, S.shape[1])
    part = np.argpartition(-S, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(S, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


def centroids(X, Y):
    """L2-normalised per-label centroids (sum of the label's training rows, rescaled to unit
    length: cosine scoring, i.e. the Rocchio classifier) of the labels seen in training, as CSR
    (n_seen x n_features), and the ids of those labels."""
    seen = np.flatnonzero(np.diff(Y.tocsc().indptr))
    C = (Y[:, seen].T @ X).tocsr().astype(np.float64)
    norms = np.sqrt(np.asarray(C.multiply(C).sum(axis=1)).ravel())
    C = sp.diags(1.0 / np.maximum(norms, 1e-12)) @ C
    return C.tocsr().astype(np.float32), seen


def predict_centroid(model, X, k=5, block=256):
    C, seen = model
    out = np.empty((X.shape[0], k), dtype=np.int64)
    CT = C.T.tocsr()
    for s in range(0, X.shape[0], block):
        S = (X[s:s + block] @ CT).toarray()
        out[s:s + block] = seen[topk_dense_rows(S, k)]
    return out


def predict_knn(Xtr, Ytr, X, k=5, n_neighbours=10, block=512):
    out = np.empty((X.shape[0], k), dtype=np.int64)
    XtrT = Xtr.T.tocsr()
    for s in range(0, X.shape[0], block):
        sim = (X[s:s + block] @ XtrT).toarray()
        nb = topk_dense_rows(sim, n_neighbours)
        w = np.take_along_axis(sim, nb, axis=1)
        m = nb.shape[0]
        # label scores = sum over neighbours of similarity * neighbour's label row
        W = sp.csr_matrix((w.ravel(), nb.ravel(), np.arange(0, m * n_neighbours + 1, n_neighbours)),
                          shape=(m, Xtr.shape[0]))
        L = (W @ Ytr).toarray()
        out[s:s + block] = topk_dense_rows(L, k)
    return out


def run(spec, seed=0):
    name, _, rest = spec.partition(":")
    kw = {}
    for item in filter(None, rest.split(",")):
        key, val = item.split("=")
        kw[key] = float(val) if "." in val else int(val)
    t0 = time.perf_counter()
    Xtr, Ytr, Xte, Yte = generate(name, seed=seed, **kw)
    tgen = time.perf_counter() - t0
    freq = np.asarray(Ytr.sum(axis=0)).ravel()
    top = np.argsort(-freq, kind="stable")[:5]
    res = {"most_frequent": np.tile(top, (Xte.shape[0], 1))}
    t0 = time.perf_counter()
    res["centroid"] = predict_centroid(centroids(Xtr, Ytr), Xte)
    tc = time.perf_counter() - t0
    t0 = time.perf_counter()
    res["knn"] = predict_knn(Xtr, Ytr, Xte)
    tk = time.perf_counter() - t0
    labels_with_train = int((freq > 0).sum())
    print(f"## {spec} seed={seed}: train {Xtr.shape} nnz/pt {Xtr.nnz / Xtr.shape[0]:.1f} "
          f"labels/pt {Ytr.nnz / Ytr.shape[0]:.2f}; labels seen in train {labels_with_train}"
          f" ({labels_with_train / Ytr.shape[1]:.1%}); gen {tgen:.1f}s centroid {tc:.1f}s knn {tk:.1f}s")
    for model, topk in res.items():
        ps = [precision_at_k(Yte, topk, kk) for kk in (1, 3, 5)]
        print(f"| {spec} | {model} | {ps[0]:.3f} | {ps[1]:.3f} | {ps[2]:.3f} |")
    sys.stdout.flush()


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="+", metavar="PRESET[:KEY=VALUE,...]",
                    help="a synthetic preset, e.g. tiny or amazon670k:n_train=50000,n_test=5000")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(f"commit: {common.git_commit()}", flush=True)
    for spec in args.specs:
        run(spec, seed=args.seed)


if __name__ == "__main__":
    main()
