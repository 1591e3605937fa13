"""The re-ranker's candidates and their features (``slide.rank.rerank``): per row, the
network's top ``N_TOP`` labels, every label of its nearest training rows in the hidden layer
(``slide.rank.vote``) and of its word neighbours (``slide.rank.words``), and the labels the
centroid index retrieved, each with the ``FEATURES`` below, written by one Numba pass over the
rows (``candidate_features``) into flat slots (``features``)."""
from typing import NamedTuple

import numpy as np
from numba import prange

from slide import defaults
from slide.kernels.arrays import Csr
from slide.kernels.jit import njit
from slide.kernels.topk import topk_lse_of_logits
from slide.rank.vote import POWER
from slide.rank import words as words_mod
from slide.rank.words import POWER as WORD_POWER

FEATURES = ("log_prob", "prob", "vote", "neighbour_share", "best_similarity", "first_rank",
            "network_rank", "log_count", "nearest_similarity", "centroid_cosine",
            "linear_score", "head_score", "word_vote")
N_BASE = len(FEATURES)
# the feature columns by name (Numba reads them as compile-time constants)
LOG_PROB = FEATURES.index("log_prob")
PROB = FEATURES.index("prob")
VOTE = FEATURES.index("vote")
NEIGHBOUR_SHARE = FEATURES.index("neighbour_share")
BEST_SIMILARITY = FEATURES.index("best_similarity")
FIRST_RANK = FEATURES.index("first_rank")
NETWORK_RANK = FEATURES.index("network_rank")
LOG_COUNT = FEATURES.index("log_count")
NEAREST_SIMILARITY = FEATURES.index("nearest_similarity")
CENTROID_COSINE = FEATURES.index("centroid_cosine")
LINEAR_SCORE = FEATURES.index("linear_score")
HEAD_SCORE = FEATURES.index("head_score")
WORD_VOTE = FEATURES.index("word_vote")

N_TOP = defaults.RERANK_N_TOP   # the network's top labels among a row's candidates


@njit(cache=True, nogil=True)
def _log_sigmoid(z):
    if z >= 0:
        return -np.log1p(np.exp(-z))
    return z - np.log1p(np.exp(z))


class NetworkTop(NamedTuple):
    """The network's side of a block of rows: each row's top labels ``ids`` [n, t] (-1
    padded) and their logits ``z``, best first, and the row's log-sum-exp ``lse`` [n]."""
    ids: np.ndarray
    z: np.ndarray
    lse: np.ndarray


class Neighbours(NamedTuple):
    """A block of rows' nearest memory rows ``near`` [n, k] (-1 padded) and their
    similarities ``sims``, best first; the labels of the ``n_new`` nearest of them may join
    the candidates (the hidden layer's: all k)."""
    near: np.ndarray
    sims: np.ndarray
    n_new: int


class Candidates(NamedTuple):
    """The candidates written by ``candidate_features``: row r's ``n[r]`` candidates are
    ``ids[ptr[r]:ptr[r] + n[r]]``, their features the same rows of ``feat`` [slots, N_BASE]."""
    ptr: np.ndarray
    ids: np.ndarray
    feat: np.ndarray
    n: np.ndarray


@njit(cache=True, nogil=True)
def _new_candidate(out_ids, out_feat, u, j, network_rank):
    """Slot u holds candidate j: features zeroed but its rank in the network's top (1 when
    absent) and its first neighbour's rank, 1 (k / k) until a neighbour carries it."""
    out_ids[u] = j
    out_feat[u, :] = 0.0
    out_feat[u, FIRST_RANK] = 1.0
    out_feat[u, NETWORK_RANK] = network_rank


@njit(cache=True, nogil=True)
def _slot_table(n_slots):
    """An empty open-addressing table for a row's candidates (label -> slot): a power of two
    at least twice the row's slots, -1 for free. A linear search of the candidates per voted
    label was 1.0 of the 3.3 s of 4,096 rows' features at 133k labels (~700 voted labels a
    row against ~225 candidates)."""
    size = 16
    while size < 2 * n_slots:
        size *= 2
    return np.full(size, -1, np.int64)


@njit(cache=True, nogil=True)
def _find_slot(table, out_ids, j):
    """(slot holding label j or -1, the table position where j is or would go)."""
    mask = table.shape[0] - 1
    h = np.int64((np.uint64(j) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)) & mask
    while table[h] >= 0:
        if out_ids[table[h]] == j:
            return table[h], h
        h = (h + 1) & mask
    return -1, h


@njit(cache=True, nogil=True)
def _slot_of(table, out_ids, out_feat, j, a, m, may_add):
    """(label j's slot among a row's candidates, the row's candidate count): where j is not
    among the m it has and ``may_add``, a new candidate after them; slot -1 where it may not."""
    u, h = _find_slot(table, out_ids, j)
    if u < 0 and may_add:
        u = a + m
        table[h] = u
        _new_candidate(out_ids, out_feat, u, j, 1.0)
        m += 1
    return u, m


@njit(cache=True, nogil=True)
def _add_top(top_ids, top_z, a, out_ids, out_feat, table):
    """The network's top labels of one row as its first candidates (from slot a); the logit
    waits in the LOG_PROB column until ``_finish_candidates``. Returns how many."""
    m = 0
    for t in range(top_ids.shape[0]):
        j = top_ids[t]
        if j < 0:
            continue
        table[_find_slot(table, out_ids, j)[1]] = a + m
        _new_candidate(out_ids, out_feat, a + m, j, min(t, N_TOP) / N_TOP)
        out_feat[a + m, LOG_PROB] = top_z[t]
        m += 1
    return m


@njit(cache=True, nogil=True)
def _add_votes(near, sims, m_ptr, m_ids, a, m, out_ids, out_feat, table):
    """The labels of one row's nearest memory rows (``near``, similarities ``sims``, best
    first) into its candidates after the m it has: the vote share, neighbour share, best
    similarity and first neighbour's rank of each. Returns the row's candidate count."""
    k = near.shape[0]
    wsum = 0.0
    for t in range(k):
        wsum += max(sims[t], 0.0) ** POWER
    if wsum == 0.0:
        wsum = 1.0
    for t in range(k):
        i = near[t]
        if i < 0:
            continue
        s = sims[t]
        w = max(s, 0.0) ** POWER / wsum
        for q in range(m_ptr[i], m_ptr[i + 1]):
            # int64 ids and a bool, not a literal: one compiled signature for every caller
            u, m = _slot_of(table, out_ids, out_feat, np.int64(m_ids[q]), a, m, np.bool_(True))
            out_feat[u, VOTE] += w
            out_feat[u, NEIGHBOUR_SHARE] += 1.0 / k
            if s > out_feat[u, BEST_SIMILARITY]:
                out_feat[u, BEST_SIMILARITY] = s
            if t / k < out_feat[u, FIRST_RANK]:
                out_feat[u, FIRST_RANK] = t / k
    return m


@njit(cache=True, nogil=True)
def _add_word_votes(near, sims, n_new, m_ptr, m_ids, a, m, out_ids, out_feat, table):
    """The share of the words' vote of one row's candidates (its word neighbours, ``near``,
    similarities ``sims``: ``slide.rank.words``); the labels of its ``n_new`` nearest word
    neighbours join the m candidates it has. Returns the row's candidate count."""
    wsum = 0.0
    for t in range(near.shape[0]):
        if near[t] >= 0:
            wsum += max(sims[t], 0.0) ** WORD_POWER
    for t in range(near.shape[0]):
        i = near[t]
        if i < 0:
            continue
        w = max(sims[t], 0.0) ** WORD_POWER / wsum if wsum > 0.0 else 0.0
        for q in range(m_ptr[i], m_ptr[i + 1]):
            u, m = _slot_of(table, out_ids, out_feat, np.int64(m_ids[q]), a, m, t < n_new)
            if u >= 0:
                out_feat[u, WORD_VOTE] += w
    return m


@njit(cache=True, nogil=True)
def _add_retrieved(labels, a, m, out_ids, out_feat, table):
    """The labels the centroid index retrieved for one row (-1 padded) into its candidates
    after the m it has, those not among them yet. Returns the row's candidate count."""
    for t in range(labels.shape[0]):
        j = labels[t]
        if j >= 0:
            m = _slot_of(table, out_ids, out_feat, j, a, m, np.bool_(True))[1]
    return m


@njit(cache=True, nogil=True)
def _centroid_dot(x_ind, x_dat, x0, x1, c_ids, c_val, c0, c1):
    """The dot product of an input row and a centroid: a merge of two sorted id lists."""
    dot = 0.0
    p, c = x0, c0
    while p < x1 and c < c1:
        if x_ind[p] == c_ids[c]:
            dot += x_dat[p] * c_val[c]
            p += 1
            c += 1
        elif x_ind[p] < c_ids[c]:
            p += 1
        else:
            c += 1
    return dot


@njit(cache=True, nogil=True)
def _finish_candidates(r, a, m, n_top, lse, sigmoid, nearest, H, Wo, bo, log_count, cen, X,
                       out_ids, out_feat):
    """The features of row r's m candidates that need the label: the log-probability and
    probability (the logit of a voted label outside the top computed here), the label's
    count, the nearest similarity, the cosine to the label's centroid (``cen``, CSR)."""
    x0, x1 = X.ptr[r], X.ptr[r + 1]
    x_norm = 0.0
    for p in range(x0, x1):
        x_norm += X.dat[p] * X.dat[p]
    x_norm = np.sqrt(x_norm)
    if x_norm == 0.0:
        x_norm = 1.0
    for u in range(a, a + m):
        j = out_ids[u]
        if u - a < n_top:
            z = out_feat[u, LOG_PROB]
        else:
            z = bo[j]
            for d in range(H.shape[1]):
                z += H[r, d] * Wo[j, d]
        lp = _log_sigmoid(z) if sigmoid else z - lse
        out_feat[u, LOG_PROB] = lp
        out_feat[u, PROB] = np.exp(lp)
        out_feat[u, LOG_COUNT] = log_count[j]
        out_feat[u, NEAREST_SIMILARITY] = nearest
        dot = _centroid_dot(X.ind, X.dat, x0, x1, cen.ind, cen.dat, cen.ptr[j], cen.ptr[j + 1])
        out_feat[u, CENTROID_COSINE] = dot / x_norm


@njit(cache=True, parallel=True)
def candidate_features(top, sigmoid, nb, word_nb, m_ptr, m_ids, retrieved, H, Wo, bo,
                       log_count, cen, X, out):
    """Per row r: its candidates -- the network's top labels (``top``, a ``NetworkTop``) then
    every label of its nearest memory rows (``nb``, ``Neighbours`` in the hidden layer; the
    memory's labels CSR ``m_ptr``/``m_ids``), then those of its word neighbours (``word_nb``,
    no columns for none), then the labels the centroid index
    retrieved (``retrieved[r]``, -1 padded) -- written from ``out.ptr[r]`` into ``out.ids``
    with their features in ``out.feat`` (the columns of ``FEATURES`` but ``linear_score``);
    ``out.n[r]``: how many. ``H``/``Wo``/``bo``: the hidden rows and output layer (the logits
    of voted labels outside the top); ``cen``: the label centroids (CSR, ids sorted); ``X``:
    the input rows (CSR, ids sorted)."""
    # the output arrays out of their bundle before the prange (Numba 0.68 drops stores made
    # through a bundle attribute inside one)
    cand_ptr, out_ids, out_feat, out_n = out.ptr, out.ids, out.feat, out.n
    top_ids, top_z, lse = top.ids, top.z, top.lse
    near, sims, word_near, word_sims = nb.near, nb.sims, word_nb.near, word_nb.sims
    k = near.shape[1]
    for r in prange(near.shape[0]):
        a = cand_ptr[r]
        table = _slot_table(cand_ptr[r + 1] - a)
        n_top = _add_top(top_ids[r], top_z[r], a, out_ids, out_feat, table)
        m = _add_votes(near[r], sims[r], m_ptr, m_ids, a, n_top, out_ids, out_feat, table)
        m = _add_word_votes(word_near[r], word_sims[r], word_nb.n_new, m_ptr, m_ids, a, m,
                            out_ids, out_feat, table)
        m = _add_retrieved(retrieved[r], a, m, out_ids, out_feat, table)
        out_n[r] = m
        nearest = sims[r, 0] if k > 0 and near[r, 0] >= 0 else 0.0
        # a parallel loop's index is int64 where Numba first types the body and uint64 in
        # the parallel build: cast, or the callee compiles twice
        _finish_candidates(np.int64(r), a, m, n_top, lse[r], sigmoid, nearest, H, Wo, bo,
                           log_count, cen, X, out_ids, out_feat)


def features(output, X, H, memory, k_nn, centroids, n_top, exclude=None, log_count=None,
             linear=None, retrieved=None, head=None, words=None):
    """The candidates of the rows X (their hidden layer H) and their features: (cand_ptr
    [n + 1] int64 of the upper-bound slots, counts [n], ids [slots] int64, features
    [slots, N_BASE] float64); slots beyond a row's count are unused. ``exclude``: memory rows
    that are never neighbours; ``log_count``: the labels' log(1 + count) (default: the
    memory's); ``linear``: the ``LabelLinear`` of the linear_score feature (0 without);
    ``retrieved``: [n, r] int64 labels of the centroid index (-1 padded; None: none);
    ``head``: the ``HeadClassifiers`` of the head_score feature (0 without); ``words``: the
    ``WordIndex`` of the word_vote feature and candidates (0 and none without)."""
    Wo, bo = output.W, output.b
    n = H.shape[0]
    top_z, top_ids, run_max, run_sum = topk_lse_of_logits(H, Wo, bo, min(n_top, Wo.shape[0]))
    sigmoid = output.sigmoid
    lse = np.zeros(n) if sigmoid else run_max + np.log(run_sum)
    near, sims = memory.nearest(H, k_nn, exclude)
    per_row = np.diff(memory.label_indptr)
    if retrieved is None:
        retrieved = np.full((n, 0), -1, np.int64)
    word_near, word_sims = (np.full((n, 0), -1, np.int64), np.zeros((n, 0), np.float32)) \
        if words is None else words.nearest(X, exclude=exclude)
    word_new = word_near[:, :words_mod.NEW_ROWS]       # the word neighbours adding labels
    voted = np.where(near >= 0, per_row[np.maximum(near, 0)], 0).sum(axis=1) \
        + np.where(word_new >= 0, per_row[np.maximum(word_new, 0)], 0).sum(axis=1)
    bound = top_ids.shape[1] + retrieved.shape[1] + voted
    cand_ptr = np.concatenate([[0], np.cumsum(bound)]).astype(np.int64)
    ids = np.full(cand_ptr[-1], -1, np.int64)
    F = np.zeros((cand_ptr[-1], N_BASE), np.float64)
    counts = np.zeros(n, np.int64)
    c_ptr, c_ids, c_val = centroids
    candidate_features(NetworkTop(top_ids, top_z, lse), sigmoid,
                       Neighbours(near, sims, near.shape[1]),
                       Neighbours(word_near, word_sims, words_mod.NEW_ROWS),
                       memory.label_indptr, memory.label_ids, retrieved,
                       np.ascontiguousarray(H, np.float32), Wo, bo,
                       memory.log_counts() if log_count is None else log_count,
                       Csr(c_ptr, c_ids, c_val),
                       Csr(X.indptr.astype(np.int64), X.indices.astype(np.int32, copy=False),
                           X.data.astype(np.float32, copy=False)),
                       Candidates(cand_ptr, ids, F, counts))
    if linear is not None:
        linear.score_into(X, cand_ptr, counts, ids, F, LINEAR_SCORE)
    if head is not None:
        head.score_into(X, cand_ptr, counts, ids, F, HEAD_SCORE)
    return cand_ptr, counts, ids, F


def _continue_with(out, ranked):
    """Fill the -1 slots at the end of ``out`` (a row's re-ranked labels, best first) with the
    labels of ``ranked`` (best first) it does not hold yet, in order."""
    n = int(np.count_nonzero(out >= 0))
    extra = ranked[(ranked >= 0) & ~np.isin(ranked, out[:n])][:out.shape[0] - n]
    out[n:n + extra.shape[0]] = extra


def _used(cand_ptr, counts):
    """The slots holding candidates (row-major): a boolean mask over the slots."""
    slot_row = np.repeat(np.arange(counts.shape[0]), np.diff(cand_ptr))
    offset = np.arange(cand_ptr[-1]) - cand_ptr[slot_row]
    return offset < counts[slot_row], slot_row
