"""The neighbour vote: a query's labels voted by its nearest training rows in the network's
last hidden layer, blended with the network's softmax.

A 128-wide softmax network generalises through its hidden layer but cannot give each of tens of
thousands of labels its own decision surface; a label tree's per-label linear classifiers can,
and that is where the trees' lead came from (``bench/results/accuracy.md``). The hidden layer
the network learned is a good metric, though: on the real sets, the labels of a query's 20
nearest training rows in it (cosine similarity) predict the top label better than the network's
own output layer, and a blend of the two better still (debdeps 0.738 -> 0.770 P@1, debtags
0.939 -> 0.952; ``bench/results/accuracy_summary.md``, round 4). So after training,
``SlideClassifier`` keeps a memory of the training rows -- their L2-normalised last hidden
layer (float32 ``[n_rows, h]``) and their labels (CSR) -- and its exact predictions score
label j for a row as

    (1 - weight) * softmax(z)_j + weight * vote_j,
    vote_j = (sum over the k nearest rows r with label j of s_r ** POWER)
             / (sum over the k nearest rows of s_r ** POWER)

with ``s_r`` the cosine similarity (negative ones count 0). The vote is sparse (at most k times
the labels per row), so the blend's top-k lies in the union of the network's top-k and the voted
labels: nothing but those is scored twice.

Cost: the memory is ``n_rows * h`` float32 plus the training labels (45,472 x 128 on debdeps:
23 MB); a query costs ``n_rows * h`` multiply-adds (one BLAS product per block of queries), the
same order as exact scoring of ``n_labels * h`` on extreme-classification sets, where rows and
labels are of the same magnitude. The memory is built at the end of ``fit`` from the training
rows, dropped when training changes the weights again (``partial_fit``: rebuild it with
``SlideClassifier.fit_neighbours``), and saved in checkpoints (``nbr_*`` arrays).
"""
import numpy as np
import scipy.sparse as sp

from slide import defaults
from slide.kernels.jit import njit
from slide.kernels.topk import dense_logits, fold_topk, insert_best_first


STATE_FORMAT = 1
# similarities are raised to this power before voting (slide.defaults)
POWER = defaults.VOTE_POWER
# a block of queries is scored against every memory row: as many queries as make this many
# similarities (each block reads the memory once) ...
_BLOCK_ENTRIES = 1 << 24
# ... computed in chunks of memory rows of at most this many similarities each (the 64 MB
# block was the top of the re-ranker fit's peak at Amazon-670K's 490k memory rows)
_CHUNK_ENTRIES = 1 << 22


def _l2_rows(H, inplace=False):
    """Rows of H scaled to unit L2 norm (float32). ``inplace``: H itself is scaled when it is
    float32 and C-contiguous already (the memory of a large training set is built this way:
    a second copy of [n_rows, h] was most of the vote's peak memory at Amazon-670K's shape)."""
    H = np.ascontiguousarray(H, dtype=np.float32)
    norms = np.empty(H.shape[0], np.float32)
    step = 1 << 16      # einsum in float64 casts its operands: block by block, not all of H
    for a in range(0, H.shape[0], step):
        blk = H[a:a + step]
        norms[a:a + step] = np.sqrt(np.einsum("ij,ij->i", blk, blk, dtype=np.float64))
    norms[norms == 0] = 1.0         # an all-zero hidden layer: similarity 0 to every row
    if inplace:
        H /= norms[:, None]
        return H
    return H / norms[:, None]


class NeighbourMemory:
    """The training rows' normalised hidden layers and their labels.

    ``emb``: float32 [n_rows, h], unit rows (or zero); ``label_indptr`` int64 [n_rows + 1] and
    ``label_ids`` int32: row r's labels are ``label_ids[label_indptr[r]:label_indptr[r + 1]]``;
    ``n_labels``: the output layer's size."""

    def __init__(self, emb, label_indptr, label_ids, n_labels):
        self.emb = emb
        self.label_indptr = label_indptr
        self.label_ids = label_ids
        self.n_labels = int(n_labels)
        self._labels = sp.csr_matrix(
            (np.ones(label_ids.shape[0], np.float32), label_ids, label_indptr),
            shape=(emb.shape[0], self.n_labels))

    @classmethod
    def build(cls, H, Y, copy=True):
        """From the hidden layer ``H`` [n, h] of n training rows and their labels ``Y``
        (scipy CSR [n, n_labels]). ``copy=False``: H (float32, C-contiguous) becomes the
        memory, normalised in place (for a caller that computed H for this alone)."""
        if H.shape[0] != Y.shape[0]:
            raise ValueError(f"{H.shape[0]} hidden rows for {Y.shape[0]} label rows")
        Y = Y.tocsr()
        return cls(_l2_rows(H, inplace=not copy), Y.indptr.astype(np.int64),
                   Y.indices.astype(np.int32), Y.shape[1])

    @property
    def n_rows(self):
        return self.emb.shape[0]

    @property
    def dim(self):
        return self.emb.shape[1]

    def fits(self, dim, n_labels):
        return self.dim == int(dim) and self.n_labels == int(n_labels)

    def nbytes(self):
        return self.emb.nbytes + self.label_indptr.nbytes + self.label_ids.nbytes

    # -- querying ------------------------------------------------------------------------------
    def log_counts(self):
        """log(1 + each label's count among the memory's rows): float64 [n_labels] (cached)."""
        if getattr(self, "_log_counts", None) is None:
            self._log_counts = np.log1p(np.bincount(self.label_ids, minlength=self.n_labels)
                                        .astype(np.float64))
        return self._log_counts

    def _nearest_blocks(self, H, k, exclude=None):
        """(first query, nearest memory rows [b, k] int64, their similarities [b, k] float32,
        best first) per block of queries; the memory rows ``exclude`` (indices) are never
        among them."""
        Q = _l2_rows(H)
        step = max(1, _BLOCK_ENTRIES // max(self.n_rows, 1))
        cols = max(1, _CHUNK_ENTRIES // step)
        ex = None if exclude is None else np.unique(np.asarray(exclude, np.int64))
        no_bias = np.zeros(min(cols, self.n_rows), np.float32)
        for a in range(0, Q.shape[0], step):
            q = Q[a:a + step]
            near = np.full((q.shape[0], k), -1, np.int64)
            sims = np.full((q.shape[0], k), -np.inf, np.float32)
            for c0 in range(0, self.n_rows, cols):
                c1 = min(self.n_rows, c0 + cols)
                # one single-threaded product per thread over the block's rows: the callers
                # hold BLAS to one thread, where numpy's one product left the other cores idle
                S = dense_logits(q, self.emb[c0:c1], no_bias[:c1 - c0])
                if ex is not None:
                    S[:, ex[np.searchsorted(ex, c0):np.searchsorted(ex, c1)] - c0] = -np.inf
                fold_topk(S, c0, k, near, sims)     # the running top-k over the chunks
                del S       # before the next chunk's product: one chunk alive, not two
            yield a, near, sims

    def nearest(self, H, k, exclude=None):
        """Each query's ``min(k, n_rows)`` nearest memory rows (cosine similarity of the
        hidden layers), best first: (ids [n, k] int64, similarities [n, k] float32). The
        memory rows ``exclude`` (indices; the re-ranker's held-out rows) are left out: -1 /
        -inf where fewer than k rows remain."""
        k = int(min(k, self.n_rows))
        near = np.empty((H.shape[0], k), np.int64)
        sims = np.empty((H.shape[0], k), np.float32)
        for a, nb, sb in self._nearest_blocks(H, k, exclude):
            near[a:a + nb.shape[0]] = nb
            sims[a:a + nb.shape[0]] = sb
        return near, sims

    def vote(self, H, k):
        """The vote of each query's ``k`` nearest rows: scipy CSR [n, n_labels], float32, each
        row summing to 1 (empty where no row has a positive similarity)."""
        k = int(min(k, self.n_rows))
        out = []
        for a, near, sims in self._nearest_blocks(H, k):
            sims = np.maximum(sims, 0.0) ** POWER
            rows = np.repeat(np.arange(near.shape[0]), near.shape[1])
            weights = sp.csr_matrix((sims.ravel(), (rows, near.ravel())),
                                    shape=(near.shape[0], self.n_rows))
            out.append(weights @ self._labels)
        V = sp.vstack(out).tocsr() if len(out) > 1 else out[0].tocsr()
        totals = np.asarray(V.sum(axis=1)).ravel()
        totals[totals == 0] = 1.0
        V = sp.diags(1.0 / totals) @ V
        V = V.tocsr().astype(np.float32)
        V.sort_indices()
        return V

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self):
        return {"format": STATE_FORMAT, "n_labels": self.n_labels, "emb": self.emb,
                "label_indptr": self.label_indptr, "label_ids": self.label_ids}

    @classmethod
    def from_state(cls, d):
        """ValueError naming what is wrong with a saved memory."""
        if int(d.get("format", -1)) != STATE_FORMAT:
            raise ValueError(f"unsupported neighbour memory format {d.get('format')!r}")
        emb, indptr, ids = d["emb"], d["label_indptr"], d["label_ids"]
        n_labels = int(d["n_labels"])
        if emb.ndim != 2 or emb.dtype != np.float32:
            raise ValueError("neighbour memory: emb must be a float32 matrix")
        if not np.isfinite(emb).all():
            raise ValueError("neighbour memory: emb contains non-finite values")
        if (indptr.dtype != np.int64 or indptr.shape != (emb.shape[0] + 1,) or indptr[0] != 0
                or (np.diff(indptr) < 0).any() or indptr[-1] != ids.shape[0]):
            raise ValueError("neighbour memory: label_indptr does not fit the label ids")
        if ids.dtype != np.int32 or (ids.size and (ids.min() < 0 or ids.max() >= n_labels)):
            raise ValueError(f"neighbour memory: label ids outside [0, {n_labels})")
        return cls(emb, indptr, ids, n_labels)


# ------------------------------------------------------------------------------------------------
# the blend

@njit(cache=True, nogil=True)
def _prob(z, lse, sigmoid):
    if sigmoid:
        return 1.0 / (1.0 + np.exp(-z))
    return np.exp(z - lse)


@njit(cache=True, nogil=True)
def blend_topk(top_ids, top_z, lse, v_indptr, v_ids, v_w, v_z, weight, sigmoid, k, out_ids,
               out_scores):
    """Per row: the k best labels by (1 - weight) * p(z) + weight * vote among the network's
    top labels (``top_ids``/``top_z`` [n, kt]) and the voted ones (CSR ``v_*``, their logits
    ``v_z``); p(z) = exp(z - lse) (softmax) or the sigmoid. ``out_ids`` [n, k], best first,
    -1 where fewer candidates exist; ``out_scores`` [n, k] float64: their blended scores."""
    n = top_ids.shape[0]
    for r in range(n):
        scores = out_scores[r]
        scores[:] = -np.inf
        ids = out_ids[r]
        ids[:] = -1
        a, b = v_indptr[r], v_indptr[r + 1]
        for t in range(top_ids.shape[1]):
            j = top_ids[r, t]
            if j < 0:
                continue
            v = 0.0
            for q in range(a, b):               # a row's voted labels are few (<= k_nn * |y|)
                if v_ids[q] == j:
                    v = v_w[q]
                    break
            s = (1.0 - weight) * _prob(top_z[r, t], lse[r], sigmoid) + weight * v
            insert_best_first(s, j, k, ids, scores)
        for q in range(a, b):
            j = v_ids[q]
            seen = False
            for t in range(top_ids.shape[1]):
                if top_ids[r, t] == j:
                    seen = True
                    break
            if not seen:
                s = (1.0 - weight) * _prob(v_z[q], lse[r], sigmoid) + weight * v_w[q]
                insert_best_first(s, j, k, ids, scores)


def blend_block(top_ids, top_z, lse, V, v_z, weight, sigmoid, k):
    """``blend_topk`` of one block of rows: the network's top ids and logits, the rows' lse,
    the vote V (CSR) and the voted labels' logits ``v_z``; returns (ids [n, k], scores)."""
    n = top_ids.shape[0]
    out = np.zeros((n, k), np.int64)
    out_scores = np.zeros((n, k), np.float64)
    blend_topk(np.ascontiguousarray(top_ids, np.int64), np.ascontiguousarray(top_z, np.float64),
               np.asarray(lse, np.float64), V.indptr.astype(np.int64),
               V.indices.astype(np.int64), V.data.astype(np.float64),
               np.asarray(v_z, np.float64), float(weight), bool(sigmoid), int(k), out,
               out_scores)
    return out, out_scores


def add_vote(p, V, weight):
    """Blend the vote V (CSR, the block's rows) into the dense probabilities p in place:
    (1 - weight) * p + weight * V."""
    p *= 1.0 - weight
    V = V.tocoo()
    np.add.at(p, (V.row, V.col), np.asarray(weight * V.data, p.dtype))
    return p
