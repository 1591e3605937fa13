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
   (``slide.rank.candidates``: one Numba pass over the rows);
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
The last two are the trees' kind of evidence (``bench/results/accuracy_summary.md``): without
the centroid the re-ranker gained nothing (its round 5); the hard-negative linear score added
~0.6 points of P@1 on debdeps and debtags (round 7), one-vs-rest on debtags ~0.5 more
(round 9). Where the hashed classifiers serve (many labels), the frequent labels also get a
one-vs-rest classifier over (at most 40,000 of) the fitting rows, its score the twelfth
feature ``head_score`` (0 for the other labels; ``slide.rank.head``): on debcontents, paired
on one network, P@1 +0.14 / +0.26 / +0.17 points over three seeds. The thirteenth,
``word_vote``, is j's share of the vote of the row's nearest training rows by the cosine of the
inputs (``slide.rank.words``; the index over every training row is built here and kept with
the re-ranker): +0.4 to +0.8 points of P@1, paired on debcontents networks.

Exact ``predict_topk`` ranks by the re-ranker; ``predict_proba`` stays the fixed blend (a dense
matrix over every label; the re-ranker scores only candidates). The model stores the
re-ranker's weights, the feature columns it reads, the centroids and the word index as arrays
(``rr_*`` in checkpoints).
"""
import numpy as np

from slide import defaults
from slide.data.inputs import take_rows
from slide.kernels.topk import segment_topk, topk_lse_of_logits
from slide.rank import words as words_mod
from slide.rank.candidates import (FEATURES, HEAD_SCORE, LINEAR_SCORE, N_BASE,  # noqa: F401
                                   N_TOP, WORD_VOTE, _continue_with, _used, features)
from slide.rank.centroids import (N_CANDIDATES, build_index, centroid_terms,  # noqa: F401
                                  label_centroids, label_counts, row_mask, top_labels)
from slide.rank.head import HeadClassifiers
from slide.rank.linear import OneVsRest, classifiers_from_state, fit_classifiers
from slide.rank.logistic import (expand, expanded_scores, n_terms,  # noqa: F401 (rerank.expand)
                                 newton_logistic)
from slide.rank.vote import NeighbourMemory
from slide.rank.words import WordIndex


# 1: the first ten features only (no linear_score); 2: hashed LabelLinear classifiers; 3:
# OneVsRest classifiers (slide.rank.linear); 4: hashed classifiers and the head's
# one-vs-rest ones (head_score: the first twelve features); 5: the columns it reads are saved,
# word_vote last, and the word index (its classifiers as in 2-4); all loaded
STATE_FORMATS = (1, 2, 3, 4, 5)
_LINEAR = LINEAR_SCORE          # a format-1 re-ranker uses the features before it
# the features a re-ranker of formats 1-4 reads: the first FORMAT_FEATURES[format]; one of
# format 5 saves its columns (those of its own classifiers, then word_vote)
FORMAT_FEATURES = {1: _LINEAR, 2: HEAD_SCORE, 3: HEAD_SCORE, 4: WORD_VOTE}
N_TERMS = n_terms(N_BASE)       # the features, their squares and products
# the tuned sizes of the candidates, the held-out slice, the centroids and the regression
# (the measurements that chose each: slide.defaults; N_TOP: slide.rank.candidates)
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


class ReRanker:
    """The fitted re-ranker: feature means and scales [N_BASE], coefficients [N_TERMS] and
    intercept of the logistic regression, the vote's neighbour count ``k_nn`` it was fitted
    with, the label centroids (CSR parts), the ``LabelLinear`` classifiers and how many labels
    the centroid index adds to a row's candidates (``n_retrieved``: as fitted; 0 in a
    checkpoint written before the index) and the head's classifiers (``HeadClassifiers``, or
    None), the ``WordIndex`` of the word neighbours (or None). It reads the feature
    ``columns`` (default: the first ``len(mean)``, as formats 1-4 do, ``FORMAT_FEATURES``: one
    of a format-1 checkpoint has no classifiers, one without a head no head_score)."""

    def __init__(self, mean, scale, coef, intercept, k_nn, centroids, linear=None,
                 n_retrieved=0, head=None, words=None, columns=None):
        self.mean = np.asarray(mean, np.float64)
        self.scale = np.asarray(scale, np.float64)
        self.coef = np.asarray(coef, np.float64)
        self.intercept = float(intercept)
        self.k_nn = int(k_nn)
        self.centroids = centroids
        self.linear = linear
        self.head = head
        self.words = words
        self.n_features = self.mean.shape[0]
        self.columns = np.arange(self.n_features) if columns is None \
            else np.asarray(columns, np.int64)
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
        return expanded_scores(F[:, self.columns], self.mean, self.scale, self.coef,
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
                                            retrieved=self.retrieve(X), head=self.head,
                                            words=self.words)
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
        if self.words is not None:
            d.update(self.words.state())
            d["format"], d["columns"] = 5, self.columns
        return d

    @classmethod
    def from_state(cls, d, n_labels, n_features):
        """ValueError naming what is wrong with a saved re-ranker."""
        fmt = int(d.get("format", -1))
        if fmt not in STATE_FORMATS:
            raise ValueError(f"unsupported re-ranker format {d.get('format')!r}")
        columns = _saved_columns(d, fmt)
        n_feat = columns.shape[0]
        if fmt in (2, 3, 4) and ((fmt == 3) != ("ovr_weights" in d)
                                 or (fmt == 4) != ("head_labels" in d)):
            raise ValueError(f"format {fmt} does not match the classifiers saved")
        if fmt == 5 and (HEAD_SCORE in columns) != ("head_labels" in d):
            raise ValueError("format 5: the columns do not match the classifiers saved")
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
            linear = classifiers_from_state(d, n_labels, n_features)
        if "head_labels" in d and fmt >= 4:
            head = HeadClassifiers.from_state(d, n_labels, n_features)
        words = WordIndex.from_state(d, n_features) if fmt == 5 else None
        return cls(d["mean"], d["scale"], d["coef"], d["intercept"], d["k_nn"],
                   (ptr, ids, val), linear, n_retrieved, head, words, columns)


def _saved_columns(d, fmt):
    """The feature columns a saved re-ranker reads: a prefix for formats 1-4, its own list
    (ascending, unique, word_vote last) for format 5."""
    if fmt < 5:
        return np.arange(FORMAT_FEATURES[fmt])
    columns = np.asarray(d.get("columns", ()))
    if (columns.dtype != np.int64 or columns.ndim != 1 or columns.shape[0] < 2
            or columns[-1] != WORD_VOTE or (np.diff(columns) <= 0).any() or columns[0] < 0):
        raise ValueError(f"format 5: columns must be ascending feature ids ending with "
                         f"word_vote ({WORD_VOTE})")
    return columns


def fit_reranker(output, H_all, X, Y, fit_rows, held_rows, k_nn, seed=0, block=128,
                 max_ovr_work=None):
    """Fit the re-ranker of a network (its ``OutputLayer``, and ``H_all``: the last hidden
    layer of every row of X, consumed) trained on the ``fit_rows`` of X, Y, on the held-out rows.
    Returns (the ``ReRanker``, or None when the held-out candidates hold a single class; the
    neighbour memory of every row). The held-out rows see the memory without themselves and
    the other held-out rows, and the centroids, label counts and linear classifiers of the
    fitting rows only (what a test row sees of rows the network trained on); no copy of X or
    of the hidden layer. The linear classifiers are not refitted on every row (their fit costs
    a pass of exact logits, or a neighbour search, over the rows); the centroids are."""
    H_held = H_all[held_rows]                 # before the memory normalises H_all in place
    linear = fit_classifiers(output, H_all, X, Y, fit_rows, seed, k_nn, max_ovr_work)
    # where the labels are few every one has a one-vs-rest classifier already
    head = None if isinstance(linear, OneVsRest) else HeadClassifiers.fit(
        X, Y, fit_rows, seed, max_ovr_work=max_ovr_work)
    columns = [c for c in range(N_BASE) if c != HEAD_SCORE or head is not None]
    words = WordIndex.build(X, seed) if words_mod.K > 0 else None
    if words is None:
        columns.remove(WORD_VOTE)
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
                                            linear=linear, retrieved=retrieved, head=head,
                                            words=words)
        used, slot_row = _used(cand_ptr, counts)
        Yb = Yh[a:b]
        true_keys = np.repeat(np.arange(b - a, dtype=np.int64), np.diff(Yb.indptr)) \
            * n_labels + Yb.indices
        parts_truth.append(np.isin(slot_row[used].astype(np.int64) * n_labels + ids[used],
                                   true_keys))
        parts_F.append(F[used][:, columns])
    del cen, index
    F, truth = np.concatenate(parts_F), np.concatenate(parts_truth)
    weights = ReRanker.fit_weights(F, truth, seed)
    if weights is None:
        return None, memory
    return ReRanker(*weights, k_nn=k_nn, centroids=label_centroids(X, Y, terms),
                    linear=linear, n_retrieved=N_CANDIDATES, head=head, words=words,
                    columns=columns), memory
