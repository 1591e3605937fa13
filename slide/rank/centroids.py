"""The labels' input centroids (the re-ranker's ``centroid_cosine`` feature) and a retrieval
index over them: a third source of the re-ranker's candidates, measured and left off.

The re-ranker's candidates are the network's top labels and the labels of a row's nearest rows
in the hidden layer. On debcontents (133k labels) they hold a true label for 85.9 % of the test
rows where Omikuji's first 100 labels hold one for 89.2 %
(``bench/results/hit_at_k_debcontents_f868c9b.log``),
so the gap in P@1 looked partly one of recall. The centroids find labels by the input words, the
trees' kind of evidence: each row's ``N_CANDIDATES`` best labels by the index raised that share
to 88.4-88.6 %, but with the re-ranker fitted on them P@1 and P@5 stayed where they were (the
rows only the index finds are hard rows whose retrieved labels score low on every feature;
``bench/results/retrieval_debcontents_501f85e.log``). So
``RERANK_CENTROID_CANDIDATES`` is 0; a re-ranker fitted with them records how many
(``ReRanker.n_retrieved``) and checkpoints keep that count.

Scoring every centroid is a sparse product that common words make nearly dense, so both
sides are pruned: a row queries with its ``n_terms`` largest entries, and each word's list
keeps the ``per_feature`` labels whose centroids weigh it most. The index is derived from the
centroids, so checkpoints store nothing more.
"""
from typing import NamedTuple

import numba
import numpy as np
import scipy.sparse as sp
from numba import prange

from slide import defaults
from slide.kernels.jit import njit
from slide.kernels.sort import stable_order
from slide.kernels.topk import insert_best_first, largest_positions, select_inplace

CENTROID_TERMS = defaults.RERANK_CENTROID_TERMS
_CENTROID_ENTRIES = defaults.RERANK_CENTROID_ENTRIES

N_CANDIDATES = defaults.RERANK_CENTROID_CANDIDATES
QUERY_TERMS = defaults.RERANK_CENTROID_QUERY_TERMS
LABELS_PER_FEATURE = defaults.RERANK_CENTROID_LABELS_PER_FEATURE


# ------------------------------------------------------------------------------------------------
# label centroids

def row_mask(n_rows, rows):
    mask = np.zeros(n_rows, np.bool_)
    mask[rows] = True
    return mask


def label_counts(Y, rows):
    """How many of the rows ``rows`` of Y (CSR) carry each label: int64 [n_labels] (no copy of
    Y: a copy of Amazon-670K's labels was 63 MB of the fit's peak)."""
    use = row_mask(Y.shape[0], rows)
    per_row = np.diff(Y.indptr)
    keep = np.repeat(use, per_row)
    return np.bincount(Y.indices[keep], minlength=Y.shape[1]).astype(np.int64)


def centroid_terms(n_labels):
    """Entries kept per label centroid: ``CENTROID_TERMS``, fewer at many labels."""
    return int(max(4, min(CENTROID_TERMS, _CENTROID_ENTRIES // max(1, int(n_labels)))))


@njit(cache=True, nogil=True, inline="always")
def _accumulate(acc, seen, touched, nt, i, v):
    """acc[i] += v in a dense accumulator whose touched entries are listed in touched[:nt]
    (``seen`` marks them); returns the new count."""
    if not seen[i]:
        seen[i] = True
        touched[nt] = i
        nt += 1
    acc[i] += v
    return nt


@njit(cache=True, parallel=True)
def _centroid_kernel(l_ptr, l_rows, use_row, x_ptr, x_ind, x_dat, n_features, m, n_chunks,
                     out_ids, out_vals, out_n):
    """Label j's centroid: the sum of the input rows ``l_rows[l_ptr[j]:l_ptr[j + 1]]`` that
    ``use_row`` marks, in a dense per-thread accumulator, its m largest entries (ties: the
    lower feature id) written to ``out_ids[j]`` (sorted) / ``out_vals[j]`` divided by the whole
    sum's L2 norm; ``out_n[j]``: how many."""
    n_labels = l_ptr.shape[0] - 1
    for c in prange(n_chunks):
        acc = np.zeros(n_features, np.float64)
        seen = np.zeros(n_features, np.bool_)
        touched = np.empty(n_features, np.int64)
        for j in range((c * n_labels) // n_chunks, ((c + 1) * n_labels) // n_chunks):
            nt = 0
            for q in range(l_ptr[j], l_ptr[j + 1]):
                r = l_rows[q]
                if not use_row[r]:
                    continue
                for p in range(x_ptr[r], x_ptr[r + 1]):
                    nt = _accumulate(acc, seen, touched, nt, x_ind[p], x_dat[p])
            vals = np.empty(nt, np.float64)
            norm = 0.0
            for t in range(nt):
                vals[t] = acc[touched[t]]
                norm += vals[t] * vals[t]
            norm = np.sqrt(norm)
            if norm == 0.0:
                norm = 1.0
            # the m largest values: above the m-th largest (found by partition, O(nt): a
            # full sort of a frequent label's thousands of features was most of the time),
            # then as many equal to it as fit, lower feature ids first; all when nt <= m
            keep = min(m, nt)
            thr = -np.inf
            if nt > m:
                # nt cast: Numba types it a literal 0 in one of the loop's two typings
                thr = select_inplace(vals.copy(), np.int64(nt), nt - m)
            cand = np.empty(nt, np.int64)
            n_cand = 0
            n_above = 0
            for t in range(nt):
                if vals[t] >= thr:
                    cand[n_cand] = touched[t]
                    n_cand += 1
                    if vals[t] > thr:
                        n_above += 1
            ties_left = keep - n_above
            # the output in ascending feature id (int64 bounds: a count from 0 is a literal 0
            # in one of Numba's typings of a parallel loop, which would compile the sort apart)
            order = stable_order(cand, np.int64(0), np.int64(n_cand))
            kept = 0
            for t in range(n_cand):
                f = cand[order[t]]
                if acc[f] == thr:
                    if ties_left == 0:
                        continue
                    ties_left -= 1
                out_ids[j, kept] = f
                out_vals[j, kept] = acc[f] / norm
                kept += 1
            for t in range(nt):                 # the accumulator back to zero for the next
                acc[touched[t]] = 0.0
                seen[touched[t]] = False
            out_n[j] = keep


@njit(cache=True)
def _compact_rows(ids, vals, counts):
    """Row j's first counts[j] entries of the [n, m] arrays moved to the front of their flat
    buffers, in place (an entry only ever moves to a lower position); returns how many."""
    flat_ids = ids.ravel()
    flat_vals = vals.ravel()
    m = ids.shape[1]
    pos = 0
    for j in range(ids.shape[0]):
        for t in range(counts[j]):
            flat_ids[pos] = flat_ids[j * m + t]
            flat_vals[pos] = flat_vals[j * m + t]
            pos += 1
    return pos


def label_centroids(X, Y, max_terms, rows=None):
    """Each label's input centroid: the sum of the inputs of its rows (of the rows ``rows``
    only, when given), its ``max_terms`` largest entries kept, divided by the whole sum's L2
    norm (so the cosine to it is the full centroid's, less the dropped entries). CSR parts
    (indptr int64 [n_labels + 1], ids int32 sorted, values float32), labels without rows
    empty. One parallel pass over the labels (scipy's Y.T @ X took 17 s on wiki10-31k's 675
    words and 19 labels a row)."""
    X = sp.csr_matrix(X)
    Yc = sp.csc_matrix(Y)
    n_labels, m = Y.shape[1], int(max_terms)
    ids = np.zeros((n_labels, m), np.int32)
    vals = np.zeros((n_labels, m), np.float32)
    counts = np.zeros(n_labels, np.int64)
    # a dense accumulator per chunk (17 bytes a feature): few chunks, two per thread
    n_chunks = max(1, min(n_labels, 2 * numba.get_num_threads()))
    # X's own int32 ids and float32 values (no copy: at Amazon-670K's 37M entries, int64 and
    # float64 copies of them were 0.6 GB of the fit's peak)
    use_row = np.ones(X.shape[0], np.bool_) if rows is None else row_mask(X.shape[0], rows)
    _centroid_kernel(Yc.indptr.astype(np.int64), Yc.indices.astype(np.int32, copy=False),
                     use_row,
                     X.indptr.astype(np.int64), X.indices.astype(np.int32, copy=False),
                     X.data.astype(np.float32, copy=False), X.shape[1], m, n_chunks, ids,
                     vals, counts)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    # compacted in place (a boolean-mask copy beside the [n_labels, m] arrays was twice their
    # 134 MB at Amazon-670K); copied out only when the slack is large
    total = _compact_rows(ids, vals, counts)
    ids, vals = ids.reshape(-1)[:total], vals.reshape(-1)[:total]
    if total < 0.75 * n_labels * m:
        ids, vals = ids.copy(), vals.copy()
    return indptr, ids, vals


# ------------------------------------------------------------------------------------------------
# the retrieval index

class CentroidIndex(NamedTuple):
    """Per input feature f, the labels ``labels[ptr[f]:ptr[f + 1]]`` (ascending) whose
    centroids weigh f most, with those weights ``weights``; ``n_labels``: the label count."""
    ptr: np.ndarray
    labels: np.ndarray
    weights: np.ndarray
    n_labels: int


@njit(cache=True)
def _invert(c_ptr, c_ids, c_val, n_features, per_feature):
    """The centroids (CSR over labels) transposed to lists per feature, each cut to its
    ``per_feature`` largest weights (ties: the lower label). Returns (ptr, labels, weights)."""
    n_labels = c_ptr.shape[0] - 1
    ptr = np.zeros(n_features + 1, np.int64)
    for p in range(c_ids.shape[0]):
        ptr[c_ids[p] + 1] += 1
    for f in range(n_features):
        ptr[f + 1] += ptr[f]
    labels = np.empty(c_ids.shape[0], np.int32)
    weights = np.empty(c_ids.shape[0], np.float32)
    fill = ptr[:-1].copy()
    for j in range(n_labels):               # labels in ascending order within each list
        for p in range(c_ptr[j], c_ptr[j + 1]):
            f = c_ids[p]
            labels[fill[f]] = j
            weights[fill[f]] = c_val[p]
            fill[f] += 1
    out_ptr = np.zeros(n_features + 1, np.int64)
    keep = np.empty(per_feature, np.int64)
    pos = 0
    for f in range(n_features):
        for t in range(largest_positions(weights, ptr[f], ptr[f + 1], per_feature, keep)):
            labels[pos] = labels[keep[t]]           # in place: pos never passes keep[t]
            weights[pos] = weights[keep[t]]
            pos += 1
        out_ptr[f + 1] = pos
    return out_ptr, labels[:pos].copy(), weights[:pos].copy()


def build_index(centroids, n_features, per_feature=LABELS_PER_FEATURE):
    """The ``CentroidIndex`` of the centroids (CSR parts: indptr, feature ids, values)."""
    c_ptr, c_ids, c_val = centroids
    ptr, labels, weights = _invert(np.asarray(c_ptr, np.int64), np.asarray(c_ids, np.int32),
                                   np.asarray(c_val, np.float32), int(n_features),
                                   int(per_feature))
    return CentroidIndex(ptr, labels, weights, int(c_ptr.shape[0] - 1))


@njit(cache=True, parallel=True)
def _top_labels(x_ptr, x_ind, x_dat, i_ptr, i_lab, i_wt, n_labels, n_terms, k, n_chunks,
                out):
    """Per row: the k labels of highest positive pruned centroid score, best first (ties:
    the label reached first), -1 padded, into ``out`` [n, k]. A dense accumulator per chunk
    of rows."""
    n = x_ptr.shape[0] - 1
    for c in prange(n_chunks):
        acc = np.zeros(n_labels, np.float32)
        seen = np.zeros(n_labels, np.bool_)
        touched = np.empty(n_labels, np.int32)
        terms = np.empty(n_terms, np.int64)
        scores = np.empty(k, np.float32)
        for r in range((c * n) // n_chunks, ((c + 1) * n) // n_chunks):
            m = largest_positions(x_dat, x_ptr[r], x_ptr[r + 1], n_terms, terms)     # query words
            nt = 0
            for t in range(m):
                p = terms[t]
                f = x_ind[p]
                w = x_dat[p]
                for q in range(i_ptr[f], i_ptr[f + 1]):
                    nt = _accumulate(acc, seen, touched, nt, i_lab[q], w * i_wt[q])
            out[r, :] = -1
            scores[:] = -np.inf
            for t in range(nt):
                j = touched[t]
                if acc[j] > 0.0:
                    insert_best_first(acc[j], j, k, out[r], scores)
                acc[j] = 0.0
                seen[j] = False


def top_labels(index, X, k=N_CANDIDATES, n_terms=QUERY_TERMS):
    """[n, k] int64: each row of X's (CSR) k best labels by the index, -1 padded."""
    n = X.shape[0]
    out = np.full((n, max(int(k), 0)), -1, np.int64)
    if n == 0 or k <= 0 or index.n_labels == 0:
        return out
    n_chunks = max(1, min(n, 2 * numba.get_num_threads()))
    _top_labels(X.indptr.astype(np.int64), X.indices.astype(np.int32, copy=False),
                X.data.astype(np.float32, copy=False), index.ptr, index.labels, index.weights,
                index.n_labels, int(n_terms), int(k), n_chunks, out)
    return out
