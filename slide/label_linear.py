"""Per-label linear classifiers over the input, trained against each row's hard negatives: the
re-ranker's ``linear_score`` feature (``slide.rerank``).

What a label tree has and the network lacks is a linear classifier per label over the input
words, trained among the labels it is confused with, so that a word can argue *against* a
label (Slice, Jain et al. 2019, trains such classifiers on a shortlist of negatives). Here:

- one float32 weight per hashed (input feature, label) pair, in a table of ``2**bits``
  (``bits`` from the number of updates an epoch, at most ``MAX_BITS``), and a bias per label
  started at the label's log prior;
- logistic loss on each fitting row's true labels (positives) and the network's top
  ``N_NEGATIVES`` other labels (hard negatives: those the re-ranker must tell apart), input
  rows cut to their ``MAX_ROW_TERMS`` largest entries and at unit L2 norm; Adagrad,
  ``EPOCHS`` passes, HOGWILD over the rows like the network.

The network's top labels of every fitting row cost one exact row of logits each (n_labels dot
products), so at most ``MAX_WORK / n_labels`` rows are used (all of debdeps' 41k; ~3k at
Amazon-670K's 670k labels, where the feature is weak and the re-ranker learns to weigh it so).
Measured in ``bench/results/accuracy_summary.md`` (round 7).
"""
import numpy as np
import scipy.sparse as sp
from numba import njit, prange

N_NEGATIVES = 10        # the network's top labels per row that are trained as negatives
# the classifiers read a row's this many largest entries (renormalised): a wiki10-31k row has
# ~680, and its ~300 candidates each read every one at prediction (7 s -> 24 s for 6.6k test
# rows, and 13 s of training, for no gain there); debdeps' rows have ~52
MAX_ROW_TERMS = 128
EPOCHS = 5
LEARNING_RATE = 0.2     # Adagrad's
MAX_BITS = 24           # at most 2**24 weights (64 MB, float32)
MIN_BITS = 16
MAX_WORK = 2_000_000_000    # rows x labels of exact logits for the hard negatives, at most
# logits computed at once, at most (16 MB: 2,048 rows x 32,768 labels were 268 MB of the
# fit's peak at Amazon-670K)
_BLOCK_ENTRIES = 4 << 20
_CHUNK = 32768          # output rows per product


@njit(cache=True, inline="always")
def _slot(f, j, mask):
    """The table slot of (input feature f, label j): a multiplicative hash of both."""
    h = (np.uint64(f) * np.uint64(0x9E3779B97F4A7C15)) ^ \
        (np.uint64(j) * np.uint64(0xC2B2AE3D27D4EB4F))
    h ^= h >> np.uint64(29)
    return np.int64(h & np.uint64(mask))


@njit(cache=True, inline="always")
def _score(x_ind, x_dat, p0, p1, inv_norm, j, weights, bias, mask):
    s = 0.0
    for p in range(p0, p1):
        s += x_dat[p] * weights[_slot(x_ind[p], j, mask)]
    return bias[j] + s * inv_norm


@njit(cache=True)
def _inv_norm(x_dat, p0, p1):
    n = 0.0
    for p in range(p0, p1):
        n += x_dat[p] * x_dat[p]
    return 1.0 / np.sqrt(n) if n > 0 else 0.0


@njit(cache=True)
def training_pairs(top_ids, y_ptr, y_ids):
    """Per row i: its true labels ``y_ids[y_ptr[i]:y_ptr[i + 1]]`` (target 1) then its top
    labels ``top_ids[i]`` that are not true (target 0; -1 entries skipped). Returns (pair_ptr
    [n + 1], labels, targets float32)."""
    n = top_ids.shape[0]
    ptr = np.zeros(n + 1, np.int64)
    for i in range(n):
        ptr[i + 1] = ptr[i] + (y_ptr[i + 1] - y_ptr[i]) + top_ids.shape[1]
    labels = np.empty(ptr[n], np.int64)
    targets = np.empty(ptr[n], np.float32)
    m = 0
    out_ptr = np.zeros(n + 1, np.int64)
    for i in range(n):
        for q in range(y_ptr[i], y_ptr[i + 1]):
            labels[m] = y_ids[q]
            targets[m] = 1.0
            m += 1
        for t in range(top_ids.shape[1]):
            j = top_ids[i, t]
            if j < 0:
                continue
            true = False
            for q in range(y_ptr[i], y_ptr[i + 1]):
                if y_ids[q] == j:
                    true = True
                    break
            if not true:
                labels[m] = j
                targets[m] = 0.0
                m += 1
        out_ptr[i + 1] = m
    return out_ptr, labels[:m], targets[:m]


@njit(cache=True, parallel=True)
def train_epoch(x_ptr, x_ind, x_dat, rows, order, pair_ptr, pair_labels, pair_targets,
                table, bias, bias_g2, mask, learning_rate):
    """One Adagrad pass over the rows ``rows[order]`` (HOGWILD: threads update the shared table
    without locks), each row's pairs ``pair_ptr[i]:pair_ptr[i + 1]`` in turn. ``table``
    [2**bits, 2]: each slot's weight beside its squared-gradient sum, so an update finds both
    in the cache line its score read (the table is far larger than the caches: two lines a
    slot were twice the time)."""
    for q in prange(order.shape[0]):
        i = order[q]
        r = rows[i]
        p0, p1 = x_ptr[r], x_ptr[r + 1]
        inv_norm = _inv_norm(x_dat, p0, p1)
        for u in range(pair_ptr[i], pair_ptr[i + 1]):
            j = pair_labels[u]
            z = 0.0
            for p in range(p0, p1):
                z += x_dat[p] * table[_slot(x_ind[p], j, mask), 0]
            z = bias[j] + z * inv_norm
            g = 1.0 / (1.0 + np.exp(-z)) - pair_targets[u]
            bias_g2[j] += g * g
            bias[j] -= learning_rate * g / np.sqrt(bias_g2[j] + 1e-8)
            for p in range(p0, p1):
                h = _slot(x_ind[p], j, mask)
                gw = g * x_dat[p] * inv_norm
                table[h, 1] += gw * gw
                table[h, 0] -= learning_rate * gw / np.sqrt(table[h, 1] + 1e-8)


@njit(cache=True, parallel=True)
def score_candidates(cand_ptr, counts, ids, x_ptr, x_ind, x_dat, weights, bias, mask, out,
                     col):
    """``out[u, col]``: the linear score of row r's candidate ``ids[u]`` for each of its
    ``counts[r]`` slots from ``cand_ptr[r]``."""
    for r in prange(counts.shape[0]):
        p0, p1 = x_ptr[r], x_ptr[r + 1]
        inv_norm = _inv_norm(x_dat, p0, p1)
        for u in range(cand_ptr[r], cand_ptr[r] + counts[r]):
            out[u, col] = _score(x_ind, x_dat, p0, p1, inv_norm, ids[u], weights, bias, mask)


@njit(cache=True, parallel=True)
def _strongest_entries(x_ptr, x_dat, m, keep):
    """keep[p]: whether entry p is among its row's m largest in magnitude (ties: the earlier
    entry)."""
    for r in prange(x_ptr.shape[0] - 1):
        p0, p1 = x_ptr[r], x_ptr[r + 1]
        if p1 - p0 <= m:
            keep[p0:p1] = True
            continue
        order = np.argsort(-np.abs(x_dat[p0:p1]), kind="mergesort")
        for t in range(m):
            keep[p0 + order[t]] = True


def strongest_terms(X, m=MAX_ROW_TERMS):
    """The CSR rows of X cut to their m largest entries in magnitude (ids in their order);
    X itself when no row is longer."""
    x_ptr = X.indptr.astype(np.int64)
    if X.shape[0] == 0 or np.diff(x_ptr).max() <= m:
        return X
    keep = np.zeros(X.nnz, np.bool_)
    _strongest_entries(x_ptr, X.data, int(m), keep)
    indptr = np.zeros(X.shape[0] + 1, np.int64)
    row_of = np.repeat(np.arange(X.shape[0]), np.diff(x_ptr))
    np.cumsum(np.bincount(row_of[keep], minlength=X.shape[0]), out=indptr[1:])
    return sp.csr_matrix((X.data[keep], X.indices[keep], indptr), shape=X.shape)


def table_bits(n_updates):
    """Bits of the weight table for ``n_updates`` (feature, label) updates an epoch: about one
    slot per update, within [MIN_BITS, MAX_BITS]."""
    return int(np.clip(np.ceil(np.log2(max(2, n_updates))), MIN_BITS, MAX_BITS))


class LabelLinear:
    """The fitted classifiers: ``weights`` float32 [2**bits] (the hashed table) and ``bias``
    float32 [n_labels]."""

    def __init__(self, weights, bias):
        self.weights = np.asarray(weights, np.float32)
        self.bias = np.asarray(bias, np.float32)
        self.mask = np.int64(self.weights.shape[0] - 1)

    @classmethod
    def fit(cls, net, X, Y, rows, seed=0, H=None):
        """Train on the rows ``rows`` of X, Y (CSR) against the hard negatives of the network
        ``net``; at most ``MAX_WORK / n_labels`` of the rows (a seeded subset). ``H``: the
        last hidden layer of every row of X, when at hand."""
        import numba
        from threadpoolctl import threadpool_limits
        from slide.data.inputs import take_rows
        from slide.engine.infer import topk_ids_of_logits
        n_labels = Y.shape[1]
        rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x11AB])
        rows = np.asarray(rows, np.int64)
        n_use = int(min(rows.shape[0], max(1, MAX_WORK // max(1, n_labels))))
        if n_use < rows.shape[0]:
            rows = np.sort(rng.choice(rows, n_use, replace=False))
        Wo, bo = net.output_view()
        top = np.empty((rows.shape[0], min(N_NEGATIVES, n_labels)), np.int64)
        # BLAS on every thread here (fit holds it to one beside Numba's kernels): the top-k
        # fold between its products is short, and the products are most of this fit's time
        with threadpool_limits(numba.get_num_threads(), user_api="blas"):
            step = max(64, _BLOCK_ENTRIES // min(_CHUNK, n_labels))
            for a in range(0, rows.shape[0], step):
                block = rows[a:a + step]
                Hb = net.hidden(take_rows(X, block)) if H is None else H[block]
                top[a:a + block.shape[0]] = topk_ids_of_logits(Hb, Wo, bo, top.shape[1],
                                                               _CHUNK)
        Yr = take_rows(Y, rows)
        pair_ptr, labels, targets = training_pairs(top, Yr.indptr.astype(np.int64),
                                                   Yr.indices.astype(np.int64))
        del top, Yr
        Xr = strongest_terms(take_rows(X, rows))        # the training rows, in order
        x_ptr = Xr.indptr.astype(np.int64)
        x_ind = Xr.indices.astype(np.int32, copy=False)
        x_dat = Xr.data.astype(np.float32, copy=False)
        bits = table_bits(int((np.diff(pair_ptr) * np.diff(x_ptr)).sum()))
        table = np.zeros((1 << bits, 2), np.float32)
        counts = np.bincount(labels[targets > 0], minlength=n_labels).astype(np.float64)
        bias = np.log((counts + 0.5) / (rows.shape[0] + 1.0)).astype(np.float32)
        bias_g2 = np.zeros(n_labels, np.float32)
        local = np.arange(rows.shape[0], dtype=np.int64)
        for _ in range(EPOCHS):
            train_epoch(x_ptr, x_ind, x_dat, local, rng.permutation(rows.shape[0]), pair_ptr,
                        labels, targets, table, bias, bias_g2, np.int64((1 << bits) - 1),
                        np.float32(LEARNING_RATE))
        return cls(np.ascontiguousarray(table[:, 0]), bias)

    def score_into(self, X, cand_ptr, counts, ids, F, col):
        """``F[u, col]``: the score of each used candidate slot u (rows of X)."""
        X = strongest_terms(X)
        score_candidates(cand_ptr, counts, ids, X.indptr.astype(np.int64),
                         X.indices.astype(np.int32, copy=False),
                         X.data.astype(np.float32, copy=False), self.weights, self.bias,
                         self.mask, F, int(col))
