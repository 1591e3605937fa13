"""One-vs-rest classifiers of the frequent labels (the head), beside the hashed per-label ones:
the re-ranker's ``head_score`` feature (``slide.rank.rerank``).

The hashed classifiers (``slide.rank.linear.LabelLinear``) learn each label against a row's hard
negatives only. Where a label holds many rows -- on debcontents the generic files every package
ships, ``NEWS.gz`` against ``NEWS.Debian.gz`` -- the trees' classifiers, trained on every row
that reaches their node, pick the first label better
(``bench/results/tree_disagreement_debcontents_fe2a1c2.md``). So the labels with at least
``HEAD_MIN_ROWS`` fitting rows (the ``HEAD_MAX_LABELS`` most frequent, as many as
``linear.MAX_OVR_WORK`` allows) get a ``OneVsRest`` classifier over (at most ``HEAD_MAX_ROWS``
of) the fitting rows, its score a feature of its own, 0 for the other labels. On debcontents,
paired on one network per seed (``bench/results/head_ovr_column_debcontents_27d221f.md``):
P@1 +0.0104 / +0.0069 / +0.0035 with an unbounded score in a column of its own, against
+0.0047 / +0.0030 / +0.0045 in place of the hashed score; as built, with its bounds,
+0.0014 / +0.0026 / +0.0017 (``bench/results/head_score_debcontents_e803ba1.md``),
Amazon-670K's peak memory +10-23 MB.
"""
import numpy as np
import scipy.sparse as sp

from slide import defaults
from slide.rank import linear
from slide.rank.centroids import label_counts

HEAD_MIN_ROWS = defaults.LINEAR_HEAD_MIN_ROWS
HEAD_MAX_LABELS = defaults.LINEAR_HEAD_MAX_LABELS
HEAD_MAX_ROWS = defaults.LINEAR_HEAD_MAX_ROWS
HEAD_MAX_WEIGHTS = defaults.LINEAR_HEAD_MAX_WEIGHTS


def head_labels(Y, rows, max_labels, min_rows=None):
    """int64, ascending: the labels of at least ``min_rows`` (``HEAD_MIN_ROWS``) of the rows
    ``rows`` of Y (CSR), the ``max_labels`` most frequent of them where more qualify (ties:
    the lower id); empty when none does."""
    min_rows = HEAD_MIN_ROWS if min_rows is None else int(min_rows)
    counts = label_counts(Y, np.asarray(rows, np.int64))
    head = np.flatnonzero(counts >= max(1, min_rows))
    if head.shape[0] > max_labels:
        head = np.sort(head[np.argsort(-counts[head], kind="stable")[:max(0, max_labels)]])
    return head.astype(np.int64)


def head_columns(Y, column_of):
    """CSR [n_rows, n_head]: Y's labels of the head only, each at its column
    ``column_of[label]`` (-1: not in the head, dropped); no copy of Y's other entries."""
    col = column_of[Y.indices]
    keep = col >= 0
    indptr = np.concatenate([[0], np.cumsum(keep)])[Y.indptr]
    return sp.csr_matrix((np.ones(int(keep.sum()), np.float32), col[keep].astype(np.int32),
                          indptr.astype(np.int64)), shape=(Y.shape[0], int(column_of.max()) + 1))


class HeadClassifiers:
    """The head's labels (int64, ascending), their ``OneVsRest`` classifiers (column c: label
    ``labels[c]``) and each label's column (``column_of``, -1 outside the head)."""

    def __init__(self, labels, ovr, n_labels):
        self.labels = np.asarray(labels, np.int64)
        self.ovr = ovr
        self.column_of = np.full(int(n_labels), -1, np.int64)
        self.column_of[self.labels] = np.arange(self.labels.shape[0])

    def _fit_ovr(self, X, Y, rows, seed):
        self.ovr = linear.OneVsRest.fit(X, head_columns(Y, self.column_of), rows, seed,
                                        HEAD_MAX_WEIGHTS)
        return self

    @classmethod
    def fit(cls, X, Y, rows, seed=0, min_rows=None, max_ovr_work=None):
        """The head's classifiers over the rows ``rows`` of X, Y (CSR), or None without a
        head. At most ``HEAD_MAX_ROWS`` of the rows (a seeded draw: at Amazon-670K's 490k
        rows a copy of them all was 0.8 GB of the peak), ``HEAD_MAX_LABELS`` labels, as many
        as ``linear.ovr_work_cap(max_ovr_work)`` allows, and ``HEAD_MAX_WEIGHTS`` weights."""
        rows = np.asarray(rows, np.int64)
        if rows.shape[0] > HEAD_MAX_ROWS:
            rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x4EAD])
            rows = np.sort(rng.choice(rows, HEAD_MAX_ROWS, replace=False))
        terms = float(np.minimum(np.diff(X.indptr)[rows], linear.MAX_ROW_TERMS).sum())
        per_label = max(1.0, terms * linear.OVR_EPOCHS)   # one-vs-rest's work per label
        max_labels = int(min(HEAD_MAX_LABELS, linear.ovr_work_cap(max_ovr_work) // per_label))
        labels = head_labels(Y, rows, max_labels, min_rows)
        if labels.shape[0] == 0:
            return None
        return cls(labels, None, Y.shape[1])._fit_ovr(X, Y, rows, seed)

    def score_into(self, X, cand_ptr, counts, ids, F, col):
        """``F[u, col]``: each used candidate slot's head score (0 outside the head)."""
        self.ovr._score_into(X, cand_ptr, counts, ids, F, col, self.column_of)

    def state(self):
        return {"head_labels": self.labels, "head_weights": self.ovr.weights,
                "head_slot": self.ovr.slot, "head_bias": self.ovr.bias}

    @classmethod
    def from_state(cls, d, n_labels, n_features):
        """The head's classifiers saved by ``state``; ValueError naming what is wrong."""
        labels = d.get("head_labels")
        if labels is None or labels.dtype != np.int64 or labels.ndim != 1 \
                or labels.shape[0] == 0 or (np.diff(labels) <= 0).any() \
                or labels[0] < 0 or labels[-1] >= n_labels:
            raise ValueError(f"the head's labels must be ascending distinct int64 ids in "
                             f"[0, {n_labels})")
        ovr = linear.classifiers_from_state({"ovr_weights": d.get("head_weights"),
                                             "ovr_slot": d.get("head_slot"),
                                             "lin_bias": d.get("head_bias")},
                                            labels.shape[0], n_features)
        return cls(labels, ovr, n_labels)
