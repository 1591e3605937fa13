"""The first layer's forward alone over the same batches, two ways: per sample (each input
entry's row of W, as ``layers.first_forward_dense`` does, 2 rows ahead prefetched) against
feature-major (each distinct row of the batch read once and added into every sample that has the
feature; the hidden columns split between the 2 threads, so no two threads write one value).

    python bench/probes/probe_feature_major_forward.py

xc200k at 30,000 points, 200 batches of 128, a 256 MB sweep between calls so that W comes from
memory as in training. Prints ms a batch for both and the distinct rows a batch.
"""
import os
import sys
import time

import numpy as np
from numba import njit, prange

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import slide  # noqa: E402
from slide.kernels.prefetch import prefetch_row  # noqa: E402

@njit(parallel=True, fastmath=True)
def per_sample(W, B, ptr, ind, dat, rows, H):
    n_h = H.shape[1]
    for s in prange(rows.shape[0]):
        r = rows[s]
        o = H[s]
        for i in range(n_h):
            o[i] = B[i]
        a, b = ptr[r], ptr[r + 1]
        for j in range(a, b):
            if j + 2 < b:
                prefetch_row(W, np.int64(ind[j + 2]) * n_h, n_h)
            row = W[np.int64(ind[j]) * n_h: np.int64(ind[j]) * n_h + n_h]
            v = dat[j]
            for i in range(n_h):
                o[i] += v * row[i]
        for i in range(n_h):
            o[i] = max(o[i], 0.0)

@njit(parallel=True, fastmath=True)
def feature_major(W, B, uniq, row_ptr, ent_s, ent_v, n_u, H):
    n_h = H.shape[1]
    half = n_h // 2
    for part in prange(2):
        c0 = part * half
        for s in range(H.shape[0]):
            for i in range(c0, c0 + half):
                H[s, i] = B[i]
        for u in range(n_u):
            if u + 2 < n_u:
                prefetch_row(W, np.int64(uniq[u + 2]) * n_h + c0, half)
            f = uniq[u]
            row = W[np.int64(f) * n_h + c0: np.int64(f) * n_h + c0 + half]
            for e in range(row_ptr[u], row_ptr[u + 1]):
                v = ent_v[e]
                o = H[ent_s[e], c0:c0 + half]
                for i in range(half):
                    o[i] += v * row[i]

def listing(X, rows):
    sub = X[rows].tocsc()
    nz = np.flatnonzero(np.diff(sub.indptr))
    counts = np.diff(sub.indptr)[nz]
    row_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return nz.astype(np.int64), row_ptr, sub.indices.astype(np.int64), sub.data.astype(np.float32)

X, Y, _, _ = slide.generate("xc200k", seed=0, n_train=30000, n_test=10)
X = X.tocsr(); X.sort_indices()
rng = np.random.default_rng(0)
W = (rng.standard_normal((X.shape[1], 128)) * 0.05).astype(np.float32).reshape(-1)
Wo = np.zeros(256 * 1024 * 1024 // 4, np.float32)   # to flush caches between batches
B = np.zeros(128, np.float32)
H = np.zeros((128, 128), np.float32); H2 = np.zeros_like(H)
order = rng.permutation(X.shape[0])
ptr, ind, dat = X.indptr.astype(np.int64), X.indices.astype(np.int64), X.data.astype(np.float32)
lists = [listing(X, np.sort(order[128*b:128*(b+1)])) for b in range(200)]
rowsets = [np.sort(order[128*b:128*(b+1)]).astype(np.int64) for b in range(200)]
per_sample(W, B, ptr, ind, dat, rowsets[0], H); feature_major(W, B, *lists[0][:3], lists[0][3], lists[0][0].shape[0], H2)
T = {"per_sample": 0.0, "feature_major": 0.0}
for b in range(200):
    Wo[::16] += 1.0
    t = time.perf_counter(); per_sample(W, B, ptr, ind, dat, rowsets[b], H); T["per_sample"] += time.perf_counter() - t
    Wo[::16] += 1.0
    u, rp, es, ev = lists[b]
    t = time.perf_counter(); feature_major(W, B, u, rp, es, ev, u.shape[0], H2); T["feature_major"] += time.perf_counter() - t
    np.maximum(H2, 0, out=H2)
    assert np.allclose(H, H2, atol=1e-4), b
for k, v in T.items(): print(k, round(v / 200 * 1e3, 3), "ms")
print("distinct rows/batch", np.mean([l[0].shape[0] for l in lists]))
