"""The re-ranker: a logistic regression over the candidates of the neighbour vote, fitted on a
held-out slice of the training rows.

The fixed blend of ``slide.rank.vote`` ranks a row's candidate labels -- the network's top
labels and every label of its nearest training rows -- by (1 - w) * p_network + w * vote. Which
of the two to trust differs from candidate to candidate (a label many close neighbours carry
against one the network alone proposes; a frequent label against a rare one), and the network
never sees the input words directly, which the label trees' per-label linear classifiers do.
So ``fit`` can learn the ranking instead (``SlideClassifier(rerank=True)``, the default):

1. the network is trained on the rows outside a seeded held-out slice (``HOLDOUT`` of them, at
   most ``MAX_HOLDOUT_ROWS``, fewer where labels and rows are many: ``holdout_rows``);
2. the neighbour memory of every row is built; each held-out row's candidates (its nearest
   rows outside the slice, the label centroids and counts of the rows outside it: what a test
   row sees of rows the network trained on) get the ``N_BASE`` features below
   (``candidate_features``, one Numba pass over the rows);
3. a logistic regression learns from them which candidates are the row's labels; its input
   is the standardised features and their pairwise products (``N_TERMS`` weights);
4. the label centroids are rebuilt over every training row.

The features of candidate label j of a row (``FEATURES``): the network's log-probability and
probability of j, the vote's share of j, the share of the k nearest rows that carry j, the best
similarity among them, the rank of the first of them (over k), j's rank in the network's top
``N_TOP`` (1 when absent), log(1 + j's count among the memory's rows), the nearest row's
similarity, the cosine between the row's input and j's input centroid (the unit-L2 sum of
the inputs of the training rows labelled j, keeping its ``centroid_terms`` largest entries),
and j's score by a linear classifier over the input (``slide.rank.linear``, fitted on the
fitting rows: one-vs-rest where the labels are few, else against the network's hard negatives).
The last two are the trees' kind of evidence: without the centroid the re-ranker gained nothing
in the probe (``bench/results/accuracy_summary.md``, round 5); the hard-negative linear score
added ~0.6 points of P@1 on debdeps and debtags (round 7), one-vs-rest on debtags ~0.5 more
(round 9). Where the hashed classifiers serve (many labels), the frequent labels also get a
one-vs-rest classifier over (at most 40,000 of) the fitting rows, its score the twelfth
feature ``head_score`` (0 for the other labels; ``slide.rank.head``): on debcontents, paired
on one network, P@1 +0.14 / +0.26 / +0.17 points over three seeds.

Exact ``predict_topk`` ranks by the re-ranker; ``predict_proba`` stays the fixed blend (a dense
matrix over every label; the re-ranker scores only candidates). The model stores the
re-ranker's weights and the centroids as arrays (``rr_*`` in checkpoints).
"""
from typing import NamedTuple

import numpy as np
from numba import njit, prange

from slide import defaults
from slide.data.inputs import take_rows
from slide.kernels.arrays import Csr
from slide.kernels.topk import segment_topk, topk_lse_of_logits
from slide.rank.centroids import (N_CANDIDATES, build_index, centroid_terms,  # noqa: F401
                                  label_centroids, label_counts, row_mask, top_labels)
from slide.rank.head import HeadClassifiers
from slide.rank.linear import OneVsRest, classifiers_from_state, fit_classifiers
from slide.rank.logistic import (expand, expanded_scores, n_terms,  # noqa: F401 (rerank.expand)
                                 newton_logistic)
from slide.rank.vote import POWER, NeighbourMemory


# 1: the first ten features only (no linear_score); 2: hashed LabelLinear classifiers; 3:
# OneVsRest classifiers (slide.rank.linear); 4: hashed classifiers and the head's
# one-vs-rest ones (head_score: all twelve features); all loaded
STATE_FORMATS = (1, 2, 3, 4)
FEATURES = ("log_prob", "prob", "vote", "neighbour_share", "best_similarity", "first_rank",
            "network_rank", "log_count", "nearest_similarity", "centroid_cosine",
            "linear_score", "head_score")
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
_LINEAR = LINEAR_SCORE          # a format-1 re-ranker uses the features before it
# the features a re-ranker of each format reads: the first FORMAT_FEATURES[format]
FORMAT_FEATURES = {1: _LINEAR, 2: HEAD_SCORE, 3: HEAD_SCORE, 4: N_BASE}
N_TERMS = n_terms(N_BASE)       # the features, their squares and products
# the tuned sizes of the candidates, the held-out slice, the centroids and the regression
# (the measurements that chose each: slide.defaults)
N_TOP = defaults.RERANK_N_TOP
HOLDOUT = defaults.RERANK_HOLDOUT
MAX_HOLDOUT_ROWS = defaults.RERANK_MAX_HOLDOUT_ROWS
MIN_HOLDOUT_ROWS = defaults.RERANK_MIN_HOLDOUT_ROWS
MAX_HOLDOUT_WORK = defaults.RERANK_MAX_HOLDOUT_WORK
LARGE_HOLDOUT_ROWS = defaults.RERANK_LARGE_HOLDOUT_ROWS
_C = defaults.RERANK_C
_MAX_FIT_CANDIDATES = defaults.RERANK_MAX_FIT_CANDIDATES


def n_holdout(n_rows, n_labels=0, min_rows=MIN_HOLDOUT_ROWS):
    """The number of rows ``holdout_rows`` holds out of n_rows: ``HOLDOUT`` of them, at most
    ``MAX_HOLDOUT_ROWS`` and at most ``MAX_HOLDOUT_WORK / (n_labels + n_rows)`` (but that
    bound never below ``LARGE_HOLDOUT_ROWS``); 0 (no re-ranker) when that is fewer than
    ``min_rows``."""
    by_work = max(LARGE_HOLDOUT_ROWS, MAX_HOLDOUT_WORK // max(1, int(n_labels) + int(n_rows)))
    n_held = min(int(HOLDOUT * n_rows), MAX_HOLDOUT_ROWS, by_work)
    return n_held if n_held >= max(1, min_rows) else 0


def holdout_rows(n_rows, seed, min_rows=MIN_HOLDOUT_ROWS, n_labels=0):
    """(training rows, held-out rows), sorted int64: ``n_holdout`` rows held out, a seeded
    draw (a resumed fit trains on the same rows); None when ``n_holdout`` is 0."""
    n_held = n_holdout(n_rows, n_labels, min_rows)
    if n_held == 0:
        return None
    perm = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x5E5E]).permutation(n_rows)
    return np.sort(perm[n_held:]).astype(np.int64), np.sort(perm[:n_held]).astype(np.int64)


# ------------------------------------------------------------------------------------------------
# the features

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
            j = m_ids[q]
            u, h = _find_slot(table, out_ids, j)
            if u < 0:
                u = a + m
                m += 1
                table[h] = u
                _new_candidate(out_ids, out_feat, u, j, 1.0)
            out_feat[u, VOTE] += w
            out_feat[u, NEIGHBOUR_SHARE] += 1.0 / k
            if s > out_feat[u, BEST_SIMILARITY]:
                out_feat[u, BEST_SIMILARITY] = s
            if t / k < out_feat[u, FIRST_RANK]:
                out_feat[u, FIRST_RANK] = t / k
    return m


@njit(cache=True, nogil=True)
def _add_retrieved(labels, a, m, out_ids, out_feat, table):
    """The labels the centroid index retrieved for one row (-1 padded) into its candidates
    after the m it has, those not among them yet. Returns the row's candidate count."""
    for t in range(labels.shape[0]):
        j = labels[t]
        if j < 0:
            continue
        u, h = _find_slot(table, out_ids, j)
        if u < 0:
            table[h] = a + m
            _new_candidate(out_ids, out_feat, a + m, j, 1.0)
            m += 1
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
def candidate_features(top, sigmoid, near, sims, m_ptr, m_ids, retrieved, H, Wo, bo, log_count,
                       cen, X, out):
    """Per row r: its candidates -- the network's top labels (``top``, a ``NetworkTop``) then
    every label of its nearest memory rows ``near[r]`` (similarities ``sims``, best first;
    the memory's labels CSR ``m_ptr``/``m_ids``), then the labels the centroid index
    retrieved (``retrieved[r]``, -1 padded) -- written from ``out.ptr[r]`` into ``out.ids``
    with their features in ``out.feat`` (the columns of ``FEATURES`` but ``linear_score``);
    ``out.n[r]``: how many. ``H``/``Wo``/``bo``: the hidden rows and output layer (the logits
    of voted labels outside the top); ``cen``: the label centroids (CSR, ids sorted); ``X``:
    the input rows (CSR, ids sorted)."""
    # the output arrays out of their bundle before the prange (Numba 0.68 drops stores made
    # through a bundle attribute inside one)
    cand_ptr, out_ids, out_feat, out_n = out.ptr, out.ids, out.feat, out.n
    top_ids, top_z, lse = top.ids, top.z, top.lse
    k = near.shape[1]
    for r in prange(near.shape[0]):
        a = cand_ptr[r]
        table = _slot_table(cand_ptr[r + 1] - a)
        n_top = _add_top(top_ids[r], top_z[r], a, out_ids, out_feat, table)
        m = _add_votes(near[r], sims[r], m_ptr, m_ids, a, n_top, out_ids, out_feat, table)
        m = _add_retrieved(retrieved[r], a, m, out_ids, out_feat, table)
        out_n[r] = m
        nearest = sims[r, 0] if k > 0 and near[r, 0] >= 0 else 0.0
        _finish_candidates(r, a, m, n_top, lse[r], sigmoid, nearest, H, Wo, bo, log_count, cen,
                           X, out_ids, out_feat)


def features(output, X, H, memory, k_nn, centroids, n_top, exclude=None, log_count=None,
             linear=None, retrieved=None, head=None):
    """The candidates of the rows X (their hidden layer H) and their features: (cand_ptr
    [n + 1] int64 of the upper-bound slots, counts [n], ids [slots] int64, features
    [slots, N_BASE] float64); slots beyond a row's count are unused. ``exclude``: memory rows
    that are never neighbours; ``log_count``: the labels' log(1 + count) (default: the
    memory's); ``linear``: the ``LabelLinear`` of the linear_score feature (0 without);
    ``retrieved``: [n, r] int64 labels of the centroid index (-1 padded; None: none);
    ``head``: the ``HeadClassifiers`` of the head_score feature (0 without)."""
    Wo, bo = output.W, output.b
    n = H.shape[0]
    top_z, top_ids, run_max, run_sum = topk_lse_of_logits(H, Wo, bo, min(n_top, Wo.shape[0]))
    sigmoid = output.sigmoid
    lse = np.zeros(n) if sigmoid else run_max + np.log(run_sum)
    near, sims = memory.nearest(H, k_nn, exclude)
    per_row = np.diff(memory.label_indptr)
    if retrieved is None:
        retrieved = np.full((n, 0), -1, np.int64)
    voted = np.where(near >= 0, per_row[np.maximum(near, 0)], 0).sum(axis=1)
    bound = top_ids.shape[1] + retrieved.shape[1] + voted
    cand_ptr = np.concatenate([[0], np.cumsum(bound)]).astype(np.int64)
    ids = np.full(cand_ptr[-1], -1, np.int64)
    F = np.zeros((cand_ptr[-1], N_BASE), np.float64)
    counts = np.zeros(n, np.int64)
    c_ptr, c_ids, c_val = centroids
    candidate_features(NetworkTop(top_ids, top_z, lse), sigmoid, near, sims,
                       memory.label_indptr, memory.label_ids, retrieved,
                       np.ascontiguousarray(H, np.float32), Wo, bo,
                       memory.log_counts() if log_count is None else log_count,
                       Csr(c_ptr, c_ids, c_val),
                       Csr(X.indptr.astype(np.int64), X.indices.astype(np.int32, copy=False),
                           X.data.astype(np.float32, copy=False)),
                       Candidates(cand_ptr, ids, F, counts))
    if linear is not None:
        linear.score_into(X, cand_ptr, counts, ids, F, _LINEAR)
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


class ReRanker:
    """The fitted re-ranker: feature means and scales [N_BASE], coefficients [N_TERMS] and
    intercept of the logistic regression, the vote's neighbour count ``k_nn`` it was fitted
    with, the label centroids (CSR parts), the ``LabelLinear`` classifiers and how many labels
    the centroid index adds to a row's candidates (``n_retrieved``: as fitted; 0 in a
    checkpoint written before the index) and the head's classifiers (``HeadClassifiers``, or
    None). A re-ranker reads the first ``len(mean)`` features (``FORMAT_FEATURES``): one of a
    format-1 checkpoint has no classifiers, one without a head no head_score."""

    def __init__(self, mean, scale, coef, intercept, k_nn, centroids, linear=None,
                 n_retrieved=0, head=None):
        self.mean = np.asarray(mean, np.float64)
        self.scale = np.asarray(scale, np.float64)
        self.coef = np.asarray(coef, np.float64)
        self.intercept = float(intercept)
        self.k_nn = int(k_nn)
        self.centroids = centroids
        self.linear = linear
        self.head = head
        self.n_features = self.mean.shape[0]
        self.n_retrieved = int(n_retrieved)
        self._index = None          # the centroids' retrieval index, built on first use

    def retrieve(self, X):
        """[n, n_retrieved] int64: the labels the centroid index retrieves for the rows X."""
        if self.n_retrieved == 0:
            return None
        if self._index is None:
            self._index = build_index(self.centroids, X.shape[1])
        return top_labels(self._index, X, self.n_retrieved)

    # -- fitting -------------------------------------------------------------------------------
    @staticmethod
    def fit_weights(F, truth, seed=0):
        """(mean, scale, coef, intercept) of the logistic regression of ``truth`` on the
        expanded standardised features F, or None when truth has a single class."""
        if truth.all() or not truth.any():
            return None
        if F.shape[0] > _MAX_FIT_CANDIDATES:
            keep = np.sort(np.random.default_rng(seed).choice(F.shape[0], _MAX_FIT_CANDIDATES,
                                                              replace=False))
            F, truth = F[keep], truth[keep]
        mean = F.mean(axis=0)
        scale = F.std(axis=0)
        scale[scale == 0] = 1.0
        w = newton_logistic((F - mean) / scale, truth, _C)
        return mean, scale, w[:-1], float(w[-1])

    # -- scoring -------------------------------------------------------------------------------
    def score(self, F):
        """The logistic regression's decision values of the candidates' features F."""
        return expanded_scores(F[:, :self.n_features], self.mean, self.scale, self.coef,
                               self.intercept)

    def topk(self, output, X, H, memory, k):
        """(ids [n, k] int64, probabilities [n, k] float64) of each row's k best candidates
        by the re-ranker. The candidates are those it was fitted on (the network's top
        N_TOP, the voted and retrieved labels) whatever k: deeper network labels, features it
        never saw, ranked above better candidates (debcontents: P@1 0.601 at k <= 10, 0.591
        at k = 50), and a row's top 5 must not depend on k. A row with fewer than k
        candidates continues with the network's next labels, probability 0 (not re-ranked),
        so it has k unless the output layer has fewer labels."""
        k = int(k)
        cand_ptr, counts, ids, F = features(output, X, H, memory, self.k_nn, self.centroids,
                                            N_TOP, linear=self.linear,
                                            retrieved=self.retrieve(X), head=self.head)
        s = np.full(ids.shape[0], -np.inf)
        used, _ = _used(cand_ptr, counts)
        s[used] = self.score(F[used])
        out = np.zeros((H.shape[0], k), np.int64)
        out_s = np.zeros((H.shape[0], k), np.float64)
        segment_topk(cand_ptr, counts, ids, s, k, out, out_s)
        short = np.flatnonzero((out < 0).any(axis=1))
        if short.shape[0]:
            net_ids = topk_lse_of_logits(H[short], output.W, output.b, k)[1]
            for r, row in zip(short, net_ids):
                _continue_with(out[r], row)
        with np.errstate(over="ignore"):
            return out, 1.0 / (1.0 + np.exp(-out_s))

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self):
        c_ptr, c_ids, c_val = self.centroids
        d = {"format": 1, "k_nn": self.k_nn, "n_retrieved": self.n_retrieved,
             "intercept": self.intercept, "mean": self.mean,
             "scale": self.scale, "coef": self.coef, "cen_indptr": c_ptr, "cen_ids": c_ids,
             "cen_values": c_val}
        if self.linear is not None:
            d.update(self.linear.state())
            d["format"] = 3 if "ovr_weights" in d else 2
        if self.head is not None:
            d.update(self.head.state())
            d["format"] = 4
        return d

    @classmethod
    def from_state(cls, d, n_labels, n_features):
        """ValueError naming what is wrong with a saved re-ranker."""
        fmt = int(d.get("format", -1))
        if fmt not in STATE_FORMATS:
            raise ValueError(f"unsupported re-ranker format {d.get('format')!r}")
        n_feat = FORMAT_FEATURES[fmt]
        for name, size in (("mean", n_feat), ("scale", n_feat), ("coef", n_terms(n_feat))):
            a = d[name]
            if a.dtype != np.float64 or a.shape != (size,) or not np.isfinite(a).all():
                raise ValueError(f"{name} must be {size} finite float64 values")
        if not (d["scale"] > 0).all():
            raise ValueError("scale must be positive")
        if not np.isfinite(float(d["intercept"])) or int(d["k_nn"]) < 1:
            raise ValueError("bad intercept or neighbour count")
        n_retrieved = d.get("n_retrieved", 0)
        if not isinstance(n_retrieved, (int, np.integer)) or n_retrieved < 0:
            raise ValueError(f"n_retrieved must be a non-negative integer, got {n_retrieved!r}")
        ptr, ids, val = d["cen_indptr"], d["cen_ids"], d["cen_values"]
        if (ptr.dtype != np.int64 or ptr.shape != (n_labels + 1,) or ptr[0] != 0
                or (np.diff(ptr) < 0).any() or ptr[-1] != ids.shape[0]
                or val.shape != ids.shape):
            raise ValueError("the centroids' indptr does not fit the label count")
        if ids.dtype != np.int32 or val.dtype != np.float32 or not np.isfinite(val).all():
            raise ValueError("centroid ids must be int32, values finite float32")
        if ids.size and (ids.min() < 0 or ids.max() >= n_features):
            raise ValueError(f"centroid feature ids outside [0, {n_features})")
        linear = head = None
        if fmt > 1:
            if (fmt == 3) != ("ovr_weights" in d) or (fmt == 4) != ("head_labels" in d):
                raise ValueError(f"format {fmt} does not match the classifiers saved")
            linear = classifiers_from_state(d, n_labels, n_features)
        if fmt == 4:
            head = HeadClassifiers.from_state(d, n_labels, n_features)
        return cls(d["mean"], d["scale"], d["coef"], d["intercept"], d["k_nn"],
                   (ptr, ids, val), linear, n_retrieved, head)


def fit_reranker(output, H_all, X, Y, fit_rows, held_rows, k_nn, seed=0, block=128):
    """Fit the re-ranker of a network (its ``OutputLayer``, and ``H_all``: the last hidden
    layer of every row of X, consumed) trained on the ``fit_rows`` of X, Y, on the held-out rows.
    Returns (the ``ReRanker``, or None when the held-out candidates hold a single class; the
    neighbour memory of every row). The held-out rows see the memory without themselves and
    the other held-out rows, and the centroids, label counts and linear classifiers of the
    fitting rows only (what a test row sees of rows the network trained on); no copy of X or
    of the hidden layer. The linear classifiers are not refitted on every row (their fit costs
    a pass of exact logits, or a neighbour search, over the rows); the centroids are."""
    H_held = H_all[held_rows]                 # before the memory normalises H_all in place
    linear = fit_classifiers(output, H_all, X, Y, fit_rows, seed, k_nn)
    # where the labels are few every one has a one-vs-rest classifier already
    head = None if isinstance(linear, OneVsRest) else HeadClassifiers.fit(X, Y, fit_rows, seed)
    n_feat = N_BASE if head is not None else HEAD_SCORE
    memory = NeighbourMemory.build(H_all, Y, copy=False)
    del H_all
    terms = centroid_terms(Y.shape[1])
    cen = label_centroids(X, Y, terms, rows=fit_rows)
    index = build_index(cen, X.shape[1]) if N_CANDIDATES > 0 else None
    log_count = np.log1p(label_counts(Y, fit_rows).astype(np.float64))
    Xh, Yh = take_rows(X, held_rows), take_rows(Y, held_rows)
    Xh.sort_indices()
    n_labels = np.int64(Y.shape[1])
    parts_F, parts_truth = [], []
    # the logit block stays block x 32768 floats (16 MB; 1,024 rows were 128 MB of the peak
    # at Amazon-670K, 256 rows 32 MB of what stayed above rerank=False)
    for a in range(0, Xh.shape[0], block):
        b = min(Xh.shape[0], a + block)
        retrieved = None if index is None else top_labels(index, Xh[a:b], N_CANDIDATES)
        cand_ptr, counts, ids, F = features(output, Xh[a:b], H_held[a:b], memory, k_nn, cen,
                                            N_TOP, exclude=held_rows, log_count=log_count,
                                            linear=linear, retrieved=retrieved, head=head)
        used, slot_row = _used(cand_ptr, counts)
        Yb = Yh[a:b]
        true_keys = np.repeat(np.arange(b - a, dtype=np.int64), np.diff(Yb.indptr)) \
            * n_labels + Yb.indices
        parts_truth.append(np.isin(slot_row[used].astype(np.int64) * n_labels + ids[used],
                                   true_keys))
        parts_F.append(F[used, :n_feat])
    del cen, index
    F, truth = np.concatenate(parts_F), np.concatenate(parts_truth)
    weights = ReRanker.fit_weights(F, truth, seed)
    if weights is None:
        return None, memory
    return ReRanker(*weights, k_nn=k_nn, centroids=label_centroids(X, Y, terms),
                    linear=linear, n_retrieved=N_CANDIDATES, head=head), memory
