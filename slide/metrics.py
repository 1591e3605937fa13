"""Extreme-classification ranking metrics: P@k, nDCG@k, R@k, PSP@k, PSnDCG@k.

Inputs everywhere:

* ``Y_true``: the true labels, a scipy sparse matrix (any format) or dense 2-D array of shape
  ``(n_points, n_labels)``; every nonzero entry is a relevant label.
* ``topk``: an integer array ``(n_points, m)`` of predicted label ids, best first, ``m >= k``;
  ``-1`` means "no prediction" and counts as a miss. A label id may appear at most once per row.

Definitions (standard XC ones, as in the Extreme Classification Repository / pyxclib / napkinxc),
with ``rel_ij = 1`` if the j-th prediction of point i (j = 1..k) is a true label, ``y_i`` the set
of true labels of point i, and every average taken over *all* n points:

* ``P@k  = mean_i  sum_j rel_ij / k``
* ``nDCG@k = mean_i DCG_i / IDCG_i`` with ``DCG_i = sum_j rel_ij / log2(j + 1)`` and
  ``IDCG_i = sum_{l=1}^{min(k, |y_i|)} 1 / log2(l + 1)``; a point with no true label scores 0.
* ``R@k = mean_i sum_j rel_ij / |y_i|``; a point with no true label scores 0.
* ``PSP@k`` (propensity-scored precision, Jain et al. 2016), normalised by the best achievable
  value as the XC repository reports it::

      PSP@k = sum_i sum_j q[topk_ij] rel_ij / k   /   sum_i sum_{l=1}^{min(k,|y_i|)} q*_il / k

  where ``q`` are the inverse propensities and ``q*_i1 >= q*_i2 >= ...`` are the inverse
  propensities of point i's true labels sorted in decreasing order (the ideal ranking). Both sums
  run over points *before* the division (a ratio of totals, not a mean of per-point ratios).
* ``PSnDCG@k`` likewise::

      PSnDCG@k = sum_i PSDCG_i / IDCG_i   /   sum_i PSDCG*_i / IDCG_i

  with ``PSDCG_i = sum_j q[topk_ij] rel_ij / log2(j + 1)``, ``PSDCG*_i`` the same for the ideal
  ranking, ``IDCG_i`` as in nDCG@k and points with no true label left out of both sums.
  (This is the normalisation of pyxclib's ``psndcg`` and napkinxc's ``psndcg_at_k``.)

Everything is vectorised over points: a membership lookup of all ``n * k`` predictions at once by a
binary search in the sorted ``row * n_labels + label`` keys of ``Y_true``.
"""
from __future__ import annotations

import numbers

import numpy as np
import scipy.sparse as sp


__all__ = ["precision_at_k", "ndcg_at_k", "recall_at_k", "psprecision_at_k", "psndcg_at_k",
           "inverse_propensity", "evaluate"]


# ----------------------------------------------------------------------------- validation

def _as_label_csr(Y, name="Y_true"):
    """Canonical CSR 0/1 copy of ``Y`` (sorted, no duplicates, no explicit zeros)."""
    if sp.issparse(Y):
        Y = sp.csr_matrix(Y)
    else:
        arr = np.asarray(Y)
        if arr.ndim != 2 or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
            raise ValueError(f"{name} must be a 2-D numeric array or a scipy sparse matrix, "
                             f"got shape {arr.shape} and dtype {arr.dtype}")
        Y = sp.csr_matrix(arr)
    if Y.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {Y.shape}")
    Y = Y.copy()
    Y.sum_duplicates()          # also sorts the indices
    Y.eliminate_zeros()
    if Y.nnz and not np.all(np.isfinite(Y.data)):
        raise ValueError(f"{name} contains NaN or infinite values")
    Y.data = np.ones(Y.nnz, dtype=np.float64)
    return Y


def _check_k(k, name="k"):
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"{name} must be a positive integer, got {k!r}")
    return int(k)


def _as_topk(topk, n_points, n_labels, k):
    """Validated int64 copy of the first ``k`` columns of ``topk``."""
    arr = np.asarray(topk)
    if arr.ndim != 2:
        raise ValueError("topk must be a 2-D array (n_points, k) of label ids, "
                         f"got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        whole = np.issubdtype(arr.dtype, np.floating) and np.all(np.isfinite(arr))
        if whole and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise ValueError(f"topk must hold integer label ids, got dtype {arr.dtype}")
    if arr.shape[0] != n_points:
        raise ValueError(f"topk has {arr.shape[0]} rows but Y_true has {n_points} points")
    if k > arr.shape[1]:
        raise ValueError(f"k={k} is larger than topk's {arr.shape[1]} columns")
    arr = arr[:, :k].astype(np.int64)
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < -1 or hi >= n_labels:
            bad = lo if lo < -1 else hi
            raise ValueError(f"topk holds label id {bad} outside [0, {n_labels}) "
                             f"(-1 is allowed and means 'no prediction')")
        # a repeated id would be counted twice and push P@k above 1
        s = np.sort(arr, axis=1)
        dup = (s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)
        if dup.any():
            row = int(np.nonzero(dup.any(axis=1))[0][0])
            raise ValueError(f"topk row {row} repeats a label id among its first {k} predictions")
    return arr


def _as_inv_propensity(inv_propensity, n_labels):
    q = np.asarray(inv_propensity, dtype=np.float64)
    if q.ndim != 1 or q.shape[0] != n_labels:
        raise ValueError(f"inv_propensity must be a 1-D array of length n_labels={n_labels}, "
                         f"got shape {q.shape}")
    if not np.all(np.isfinite(q)) or np.any(q < 0):
        raise ValueError("inv_propensity must be finite and non-negative")
    return q


def _prepare(Y_true, topk, k):
    k = _check_k(k)
    Y = _as_label_csr(Y_true)
    T = _as_topk(topk, Y.shape[0], Y.shape[1], k)
    return Y, T, k


# ----------------------------------------------------------------------------- kernels (NumPy)

def _relevance(Y, T):
    """Boolean (n, k): is ``T[i, j]`` a true label of point i. ``-1`` entries are False."""
    n, n_labels = Y.shape
    if T.size == 0 or Y.nnz == 0:
        return np.zeros(T.shape, dtype=bool)
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(Y.indptr))
    keys = rows * n_labels + Y.indices.astype(np.int64)        # sorted: rows, then sorted indices
    q = np.arange(n, dtype=np.int64)[:, None] * n_labels + T
    pos = np.minimum(np.searchsorted(keys, q), len(keys) - 1)
    return (keys[pos] == q) & (T >= 0)


def _discounts(k):
    return 1.0 / np.log2(np.arange(2, k + 2, dtype=np.float64))


def _idcg(n_true, k):
    """``sum_{l=1}^{min(k, n_true)} 1/log2(l+1)`` per point (0 for no true label)."""
    cum = np.concatenate([[0.0], np.cumsum(_discounts(k))])
    return cum[np.minimum(n_true, k)]


def _ideal_inv_propensity(Y, q, k):
    """(n, k) matrix: the point's true labels' inverse propensities, largest first, 0-padded."""
    n = Y.shape[0]
    out = np.zeros((n, k))
    if Y.nnz == 0:
        return out
    counts = np.diff(Y.indptr)
    rows = np.repeat(np.arange(n, dtype=np.int64), counts)
    w = q[Y.indices]
    # sort by (row ascending, weight descending); position within the row = rank
    order = np.lexsort((-w, rows))
    rank = np.arange(Y.nnz, dtype=np.int64) - Y.indptr[:-1].astype(np.int64)[rows]
    keep = rank < k
    out[rows[keep], rank[keep]] = w[order][keep]
    return out


# ----------------------------------------------------------------------------- public metrics

def precision_at_k(Y_true, topk, k):
    """Precision at k: mean over points of |top-k ∩ y| / k (see the module docstring)."""
    Y, T, k = _prepare(Y_true, topk, k)
    if Y.shape[0] == 0:
        return 0.0
    return float(_relevance(Y, T).sum() / (k * Y.shape[0]))


def ndcg_at_k(Y_true, topk, k):
    """nDCG at k: DCG@k / ideal DCG@k per point, averaged over all points (empty y scores 0)."""
    Y, T, k = _prepare(Y_true, topk, k)
    n = Y.shape[0]
    if n == 0:
        return 0.0
    dcg = _relevance(Y, T) @ _discounts(k)
    idcg = _idcg(np.diff(Y.indptr), k)
    per_point = np.divide(dcg, idcg, out=np.zeros(n), where=idcg > 0)
    return float(per_point.mean())


def recall_at_k(Y_true, topk, k):
    """Recall at k: mean over points of |top-k ∩ y| / |y| (empty y scores 0)."""
    Y, T, k = _prepare(Y_true, topk, k)
    n = Y.shape[0]
    if n == 0:
        return 0.0
    hits = _relevance(Y, T).sum(axis=1).astype(np.float64)
    n_true = np.diff(Y.indptr).astype(np.float64)
    return float(np.divide(hits, n_true, out=np.zeros(n), where=n_true > 0).mean())


def psprecision_at_k(Y_true, topk, k, inv_propensity):
    """Propensity-scored P@k, normalised by its best achievable value (ratio of totals)."""
    Y, T, k = _prepare(Y_true, topk, k)
    q = _as_inv_propensity(inv_propensity, Y.shape[1])
    rel = _relevance(Y, T)
    gain = np.where(rel, q[np.maximum(T, 0)], 0.0).sum()
    best = _ideal_inv_propensity(Y, q, k).sum()
    return float(gain / best) if best > 0 else 0.0


def psndcg_at_k(Y_true, topk, k, inv_propensity):
    """Propensity-scored nDCG@k, normalised by its best achievable value (ratio of totals)."""
    Y, T, k = _prepare(Y_true, topk, k)
    q = _as_inv_propensity(inv_propensity, Y.shape[1])
    n = Y.shape[0]
    d = _discounts(k)
    idcg = _idcg(np.diff(Y.indptr), k)
    inv_idcg = np.divide(1.0, idcg, out=np.zeros(n), where=idcg > 0)
    rel = _relevance(Y, T)
    psdcg = np.where(rel, q[np.maximum(T, 0)], 0.0) @ d
    best = _ideal_inv_propensity(Y, q, k) @ d
    den = float(best @ inv_idcg)
    return float(psdcg @ inv_idcg / den) if den > 0 else 0.0


def inverse_propensity(Y_train, A=0.55, B=1.5):
    """Jain et al. (2016) inverse propensities from the training labels.

    ``C = (ln N - 1) (B + 1)^A`` and ``inv_p_l = 1 + C (N_l + B)^-A``, with N the number of training
    points and N_l the number of them carrying label l. Use A=0.6, B=2.6 for the Amazon data sets
    and A=0.5, B=0.4 for Wikipedia ones (the XC repository's convention).
    """
    Y = _as_label_csr(Y_train, name="Y_train")
    for name, v in (("A", A), ("B", B)):
        if not np.isfinite(v) or v <= 0:
            raise ValueError(f"{name} must be a positive finite number, got {v!r}")
    n = Y.shape[0]
    if n < 3:
        # C = (ln N - 1)(B + 1)^A is negative below N = e: the weights would fall under 1
        raise ValueError(f"Y_train needs at least 3 rows for Jain et al. propensities, got {n}")
    counts = np.bincount(Y.indices, minlength=Y.shape[1]).astype(np.float64)
    C = (np.log(n) - 1.0) * (B + 1.0) ** A
    return 1.0 + C * (counts + B) ** (-A)


def evaluate(Y_true, topk, ks=(1, 3, 5), inv_propensity=None):
    """All metrics at every k in ``ks``: keys ``P@k``, ``nDCG@k``, ``R@k`` and, when
    ``inv_propensity`` is given, ``PSP@k`` and ``PSnDCG@k``. Values are Python floats."""
    if isinstance(ks, numbers.Integral):
        ks = (ks,)
    ks = tuple(_check_k(k, "each k in ks") for k in ks)
    if not ks:
        raise ValueError("ks must name at least one k")
    kmax = max(ks)
    # validate and look up once at the largest k; every smaller k is a prefix
    Y, T, _ = _prepare(Y_true, topk, kmax)
    n = Y.shape[0]
    q = None if inv_propensity is None else _as_inv_propensity(inv_propensity, Y.shape[1])
    rel = _relevance(Y, T)
    n_true = np.diff(Y.indptr)
    d = _discounts(kmax)
    cum_hits = np.cumsum(rel, axis=1, dtype=np.float64)
    cum_dcg = np.cumsum(rel * d, axis=1)
    if q is not None:
        gains = np.where(rel, q[np.maximum(T, 0)], 0.0)
        ideal = _ideal_inv_propensity(Y, q, kmax)
        cum_g, cum_gd = np.cumsum(gains, axis=1), np.cumsum(gains * d, axis=1)
        cum_i, cum_id = np.cumsum(ideal, axis=1), np.cumsum(ideal * d, axis=1)
    out = {}
    for k in ks:
        j = k - 1
        idcg = _idcg(n_true, k)
        inv_idcg = np.divide(1.0, idcg, out=np.zeros(n), where=idcg > 0)
        if n == 0:
            out[f"P@{k}"] = out[f"nDCG@{k}"] = out[f"R@{k}"] = 0.0
        else:
            out[f"P@{k}"] = float(cum_hits[:, j].sum() / (k * n))
            out[f"nDCG@{k}"] = float((cum_dcg[:, j] * inv_idcg).mean())
            out[f"R@{k}"] = float(np.divide(cum_hits[:, j], n_true, out=np.zeros(n),
                                            where=n_true > 0).mean())
        if q is not None:
            best = cum_i[:, j].sum() if n else 0.0
            out[f"PSP@{k}"] = float(cum_g[:, j].sum() / best) if best > 0 else 0.0
            den = float(cum_id[:, j] @ inv_idcg) if n else 0.0
            out[f"PSnDCG@{k}"] = float(cum_gd[:, j] @ inv_idcg / den) if den > 0 else 0.0
    return out
