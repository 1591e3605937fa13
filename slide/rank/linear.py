"""Per-label linear classifiers over the input, trained against each row's hard negatives: the
re-ranker's ``linear_score`` feature (``slide.rank.rerank``).

What a label tree has and the network lacks is a linear classifier per label over the input
words, trained among the labels it is confused with, so that a word can argue *against* a
label (Slice, Jain et al. 2019, trains such classifiers on a shortlist of negatives). Here:

- one float32 weight per hashed (input feature, label) pair, in a table of ``2**bits``
  (``bits`` from the number of updates an epoch, at most ``MAX_BITS``), and a bias per label
  started at the label's log prior;
- logistic loss on each fitting row's true labels (positives) and ``N_NEGATIVES`` hard
  negatives (labels the re-ranker must tell apart from them), input rows cut to their
  ``MAX_ROW_TERMS`` largest entries and at unit L2 norm; Adagrad, ``EPOCHS`` passes, HOGWILD
  over the rows like the network.

At most ``MAX_WORK / n_labels`` fitting rows are used (all of debdeps' 41k; ~3k at
Amazon-670K's 670k labels, where the feature is weak and the re-ranker learns to weigh it so;
``bench/results/accuracy_summary.md``, round 7). A row's hard negatives are whichever of two
costs fewer dot products a row:

- the network's top labels that are not the row's (``hard_negatives``): one exact row of
  logits, n_labels dot products;
- the labels its nearest other used rows in the hidden layer vote for most that are not the
  row's (``neighbour_negatives``; the vote's k and weights): n_use dot products. These are
  what most of the re-ranker's candidates are -- ~215 of debcontents' ~225 a row are voted
  labels, 10 the network's top -- so they train the classifiers where the feature is read.
  Where labels outnumber the used rows (debcontents, the 200k- and 670k-label shapes) this is
  the cheaper one: on debcontents the classifiers' fit went from 7.6-8.7 s to 3.3-4.0 s, P@1
  +0.0011 / -0.0010 / +0.0009 (paired on the same network, seeds 0-2), on xc200k (100k rows)
  from 7.2 to 1.3-1.6 s at -0.0003 (one seed;
  ``bench/results/linear_negatives_{debcontents_255a052,xc200k_fe23776}.md``).

Where the labels are few enough that every row can afford a logistic loss on every label
(rows x row terms x labels x ``OVR_EPOCHS`` at most ``MAX_OVR_WORK``: debtags' 581 labels, not
debdeps' 26k), ``fit_classifiers`` trains ``OneVsRest`` instead: a dense weight per (input
feature, label) over the ``MAX_OVR_WEIGHTS // n_labels`` most frequent features, every other
label a negative of every row, so that any word can argue against any label. Its step is
Adagrad with the squared-gradient sums factored into a sum per feature and one per label
(G[f, j] ~ R[f] C[j] / sum(R), as Adafactor does for its moments) and each step clipped to
Adagrad's own bound, the learning rate (the factored sum can be far below a weight's own: a
rare feature with a rarely wrong label; unclipped, two of three fits on 2 threads diverged).
A per-weight sum was twice the memory and 2.5 times the time, for a lower P@1 and P@5
(``bench/results/accuracy_summary.md``, round 9).
"""
import numba
import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from slide import defaults
from slide.data.inputs import take_rows
from slide.kernels.jit import njit
from slide.kernels.sort import stable_order
from slide.kernels.topk import insert_best_first, strongest_entries, topk_ids_of_logits
from slide.rank.vote import POWER, NeighbourMemory


# the tuned sizes and rates of the classifiers' training and of its logit blocks (the
# measurements that chose each: slide.defaults)
N_NEGATIVES = defaults.LINEAR_N_NEGATIVES
MAX_ROW_TERMS = defaults.LINEAR_MAX_ROW_TERMS
EPOCHS = defaults.LINEAR_EPOCHS
LEARNING_RATE = defaults.LINEAR_LEARNING_RATE
MAX_BITS = defaults.LINEAR_MAX_BITS
MIN_BITS = defaults.LINEAR_MIN_BITS
MAX_WORK = defaults.LINEAR_MAX_WORK
_BLOCK_ENTRIES = defaults.LINEAR_BLOCK_ENTRIES
_CHUNK = defaults.LINEAR_CHUNK
_MIN_BLOCK_ROWS = defaults.LINEAR_MIN_BLOCK_ROWS
OVR_EPOCHS = defaults.LINEAR_OVR_EPOCHS
OVR_LEARNING_RATE = defaults.LINEAR_OVR_LEARNING_RATE
MAX_OVR_WORK = defaults.LINEAR_MAX_OVR_WORK
MAX_OVR_WEIGHTS = defaults.LINEAR_MAX_OVR_WEIGHTS


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


def hard_negatives(output, H, rows, k):
    """The ids [len(rows), min(k, n_labels)] of the k highest logits of the output layer
    ``output`` (``slide.rank.output.OutputLayer``) for each of the rows ``rows`` of H (the
    last hidden layer), best first. Blocks of rows, each one BLAS product per chunk of
    labels."""
    Wo, bo = output.W, output.b
    n_labels = Wo.shape[0]
    top = np.empty((rows.shape[0], min(k, n_labels)), np.int64)
    floor = _MIN_BLOCK_ROWS if n_labels <= _CHUNK else 64
    step = max(floor, _BLOCK_ENTRIES // min(_CHUNK, n_labels))
    # one BLAS thread: ``topk_ids_of_logits`` runs a product per Numba thread over its rows
    # (OpenBLAS's threads inside each would oversubscribe the cores)
    with threadpool_limits(1, user_api="blas"):
        for a in range(0, rows.shape[0], step):
            block = rows[a:a + step]
            top[a:a + block.shape[0]] = topk_ids_of_logits(H[block], Wo, bo, top.shape[1],
                                                           _CHUNK)
    return top


def neighbour_negatives(H, Y, rows, k, n_neighbours):
    """The ids [len(rows), k] (best first, -1 where fewer) of the labels that the
    ``n_neighbours`` nearest other rows of ``rows`` vote for most, each row's own labels left
    out: cosine similarity of the last hidden layer ``H`` (of every row of Y), each neighbour's
    labels weighted by its similarity ** ``vote.POWER`` as the neighbour vote weighs them
    (non-positive similarities count nothing). The neighbours are searched among ``rows``
    only: n_use dot products a row where ``hard_negatives`` costs n_labels."""
    rows = np.asarray(rows, np.int64)
    top = np.full((rows.shape[0], k), -1, np.int64)
    if rows.shape[0] < 2 or k == 0 or n_neighbours < 1:
        return top
    Yr = take_rows(Y, rows)
    # the memory's own rows as the queries: row i finds itself among its nearest (skipped)
    memory = NeighbourMemory.build(H[rows], Yr, copy=False)
    near, sims = memory.nearest(memory.emb, n_neighbours + 1)
    own_ptr, own_ids = Yr.indptr.astype(np.int64), Yr.indices.astype(np.int64)
    _vote_negatives(near, sims, memory.label_indptr, memory.label_ids, own_ptr, own_ids,
                    int(n_neighbours), float(POWER), top)
    return top


@njit(cache=True, parallel=True)
def _vote_negatives(near, sims, label_ptr, label_ids, own_ptr, own_ids, n_neighbours, power,
                    top):
    """top[i] = the labels of row i's first ``n_neighbours`` neighbours in ``near[i]`` other
    than itself (memory rows, best first; similarities ``sims``), summed by weight
    max(similarity, 0) ** power, without row i's own labels (``own_ids[own_ptr[i]:
    own_ptr[i + 1]]``), the heaviest first (ties: the lower label id). Pairs are sorted by
    label within a row: no array of n_labels per thread."""
    k = top.shape[1]
    for i in numba.prange(near.shape[0]):
        chosen = np.empty(n_neighbours, np.int64)      # positions in near[i]
        n_chosen = 0
        n_pairs = 0
        for q in range(near.shape[1]):
            r = near[i, q]
            if r >= 0 and r != i and n_chosen < n_neighbours:
                chosen[n_chosen] = q
                n_chosen += 1
                n_pairs += label_ptr[r + 1] - label_ptr[r]
        labels = np.empty(n_pairs, np.int64)
        weights = np.empty(n_pairs, np.float64)
        m = 0
        for c in range(n_chosen):
            q = chosen[c]
            r = near[i, q]
            w = max(np.float64(sims[i, q]), 0.0) ** power
            for p in range(label_ptr[r], label_ptr[r + 1]):
                labels[m] = label_ids[p]
                weights[m] = w
                m += 1
        # int64 bounds: a count that starts at 0 is a literal 0 in one of Numba's two typings
        # of a parallel loop's body, and each literal compiles the sort apart
        order = stable_order(labels, np.int64(0), np.int64(m))
        o0 = own_ptr[i]
        own_order = stable_order(own_ids, o0, own_ptr[i + 1])      # the row's own, ascending
        o = 0
        best_ids = np.full(k, -1, np.int64)
        best = np.full(k, -np.inf)
        a = 0
        while a < m:
            j = labels[order[a]]
            total = 0.0
            b = a
            while b < m and labels[order[b]] == j:
                total += weights[order[b]]
                b += 1
            a = b
            if total <= 0.0:
                continue
            # the labels come in ascending order: the pointer into the own ones only advances
            while o < own_order.shape[0] and own_ids[o0 + own_order[o]] < j:
                o += 1
            if o < own_order.shape[0] and own_ids[o0 + own_order[o]] == j:
                continue
            insert_best_first(total, j, k, best_ids, best)
        for t in range(k):
            top[i, t] = best_ids[t]


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
    for q in numba.prange(order.shape[0]):
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
    for r in numba.prange(counts.shape[0]):
        p0, p1 = x_ptr[r], x_ptr[r + 1]
        inv_norm = _inv_norm(x_dat, p0, p1)
        for u in range(cand_ptr[r], cand_ptr[r] + counts[r]):
            out[u, col] = _score(x_ind, x_dat, p0, p1, inv_norm, ids[u], weights, bias, mask)


def strongest_terms(X, m=MAX_ROW_TERMS):
    """The CSR rows of X cut to their m largest entries in magnitude (ids in their order);
    X itself when no row is longer."""
    x_ptr = X.indptr.astype(np.int64)
    if X.shape[0] == 0 or np.diff(x_ptr).max() <= m:
        return X
    keep = np.zeros(X.nnz, np.bool_)
    strongest_entries(x_ptr, X.data, int(m), keep)
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
    def fit(cls, output, H, X, Y, rows, seed=0, n_neighbours=0):
        """Train on the rows ``rows`` of X, Y (CSR) against their hard negatives (``H``: the
        last hidden layer of every row of X); at most ``MAX_WORK / n_labels`` of the rows (a
        seeded subset). The negatives are the network's top labels (``output``: its output
        layer), or, with ``n_neighbours`` > 0 and fewer used rows than labels, the labels the
        ``n_neighbours`` nearest used rows vote for (``negatives_by_neighbours``)."""
        n_labels = Y.shape[1]
        rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x11AB])
        rows = np.asarray(rows, np.int64)
        n_use = int(min(rows.shape[0], max(1, MAX_WORK // max(1, n_labels))))
        if n_use < rows.shape[0]:
            rows = np.sort(rng.choice(rows, n_use, replace=False))
        if negatives_by_neighbours(n_use, n_labels, n_neighbours):
            top = neighbour_negatives(H, Y, rows, N_NEGATIVES, n_neighbours)
        else:
            top = hard_negatives(output, H, rows, N_NEGATIVES)
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

    def state(self):
        return {"lin_weights": self.weights, "lin_bias": self.bias}


# ------------------------------------------------------------------------------------------------
# one-vs-rest (few labels)

# rows a part of ovr_epoch trains between merges (accuracy: bench/results/accuracy_levers_2core.md)
OVR_ROUND_ROWS = 64


@njit(cache=True, nogil=True)
def _ovr_row(r, x_ptr, x_ind, x_dat, slot, y_ptr, y_ids, weights, feature_g2, label_g2,
             total_g2, bias, bias_g2, learning_rate, g):
    """One row's step of ``ovr_epoch`` (``g``: scratch [n_labels]); called, not inlined: the
    parallel loop's body is compiled twice, an inlined step with it (``docs/design.md``)."""
    n_labels = bias.shape[0]
    p0, p1 = x_ptr[r], x_ptr[r + 1]
    inv_norm = _inv_norm(x_dat, p0, p1)
    g[:] = 0.0
    kept_sq = 0.0                           # the squared norm of the kept entries
    for p in range(p0, p1):
        k = slot[x_ind[p]]
        if k < 0:
            continue
        v = x_dat[p] * inv_norm
        kept_sq += v * v
        for j in range(n_labels):
            g[j] += v * weights[k, j]
    for j in range(n_labels):
        g[j] = 1.0 / (1.0 + np.exp(-(bias[j] + g[j])))
    for t in range(y_ptr[r], y_ptr[r + 1]):
        g[y_ids[t]] -= 1.0
    g_sq = 0.0
    for j in range(n_labels):
        gj2 = g[j] * g[j]
        g_sq += gj2
        bias_g2[j] += gj2
        bias[j] -= learning_rate * g[j] / np.sqrt(bias_g2[j] + 1e-8)
        label_g2[j] += gj2 * kept_sq
    total_g2[0] += g_sq * kept_sq
    for j in range(n_labels):           # g becomes each label's factor of the step
        g[j] = learning_rate * g[j] / np.sqrt(label_g2[j] + 1e-12)
    for p in range(p0, p1):
        k = slot[x_ind[p]]
        if k < 0:
            continue
        v = x_dat[p] * inv_norm
        feature_g2[k] += v * v * g_sq
        a = v / np.sqrt(feature_g2[k] / max(total_g2[0], 1e-12) + 1e-12)
        for j in range(n_labels):
            # the factored sum can be far below the weight's own (a rare feature with a
            # rarely wrong label): each step clipped to Adagrad's bound, learning_rate
            weights[k, j] -= min(max(a * g[j], -learning_rate), learning_rate)


@njit(cache=True, parallel=True)
def ovr_epoch(x_ptr, x_ind, x_dat, slot, y_ptr, y_ids, order, weights, feature_g2, label_g2,
              total_g2, bias, bias_g2, learning_rate, n_parts=1):
    """One pass of the logistic loss of every label over the rows ``order`` (each row's
    labels ``y_ids[y_ptr[r]:y_ptr[r + 1]]`` positive, the others negative). Input feature f
    is row ``slot[f]`` of ``weights`` [kept features, n_labels] (-1: not kept). The step of
    weight (f, j) is Adagrad's with its squared-gradient sum taken as
    feature_g2[f] * label_g2[j] / total_g2[0] (sums over the other index); the bias has its
    own Adagrad sum.

    Rows go in rounds of ``n_parts`` parts of ``OVR_ROUND_ROWS`` rows side by side, each part
    stepping its own copy of the per-label arrays (bias and sums), their changes added at the
    round's end; the weights and features' sums are shared (HOGWILD). Shared per-label arrays,
    written at every row, kept two threads no faster than one. One part: the plain pass."""
    n_labels = bias.shape[0]
    n = order.shape[0]
    n_parts = max(1, n_parts)
    own_bias = np.empty((n_parts, n_labels), bias.dtype)
    own_bias_g2 = np.empty((n_parts, n_labels), bias_g2.dtype)
    own_label_g2 = np.empty((n_parts, n_labels), label_g2.dtype)
    own_total = np.empty((n_parts, 1), total_g2.dtype)
    g = np.empty((n_parts, n_labels), np.float32)
    per_round = n_parts * OVR_ROUND_ROWS
    for r0 in range(0, n, per_round):
        for part in numba.prange(n_parts):
            for j in range(n_labels):   # loops, not array assignments (nested parfors)
                own_bias[part, j], own_bias_g2[part, j] = bias[j], bias_g2[j]
                own_label_g2[part, j] = label_g2[j]
            own_total[part, 0] = total_g2[0]
            lo = r0 + part * OVR_ROUND_ROWS
            for q in range(min(n, lo), min(n, lo + OVR_ROUND_ROWS)):
                _ovr_row(order[q], x_ptr, x_ind, x_dat, slot, y_ptr, y_ids, weights,
                         feature_g2, own_label_g2[part], own_total[part], own_bias[part],
                         own_bias_g2[part], learning_rate, g[part])
        for j in range(n_labels):       # part 0's values plus the other parts' changes
            nb, ng, nl = own_bias[0, j], own_bias_g2[0, j], own_label_g2[0, j]
            for part in range(1, n_parts):
                nb += own_bias[part, j] - bias[j]
                ng += own_bias_g2[part, j] - bias_g2[j]
                nl += own_label_g2[part, j] - label_g2[j]
            bias[j], bias_g2[j], label_g2[j] = nb, ng, nl
        new_total = own_total[0, 0]
        for part in range(1, n_parts):
            new_total += own_total[part, 0] - total_g2[0]
        total_g2[0] = new_total


@njit(cache=True, parallel=True)
def score_ovr(cand_ptr, counts, ids, x_ptr, x_ind, x_dat, slot, weights, bias, out, col,
              column_of):
    """``out[u, col]``: the one-vs-rest score of row r's candidate ``ids[u]`` for each of its
    ``counts[r]`` slots from ``cand_ptr[r]``. ``column_of`` (int64 [n_labels], or empty for
    the identity): the classifier of each label, -1 for none (its score 0)."""
    for r in numba.prange(counts.shape[0]):
        p0, p1 = x_ptr[r], x_ptr[r + 1]
        inv_norm = _inv_norm(x_dat, p0, p1)
        for u in range(cand_ptr[r], cand_ptr[r] + counts[r]):
            j = ids[u]
            if column_of.shape[0] > 0:
                j = column_of[j]
                if j < 0:
                    out[u, col] = 0.0
                    continue
            z = 0.0
            for p in range(p0, p1):
                k = slot[x_ind[p]]
                if k >= 0:
                    z += x_dat[p] * weights[k, j]
            out[u, col] = bias[j] + z * inv_norm


def ovr_work_cap(max_work=None):
    """The one-vs-rest classifiers' work bound: ``max_work``, or ``MAX_OVR_WORK`` where None
    (a model's own cap, ``SlideClassifier._max_ovr_work``, is None unless the warm-up lowered
    it)."""
    return MAX_OVR_WORK if max_work is None else max_work


def ovr_affordable(X, rows, n_labels, max_work=None):
    """Whether one-vs-rest over the rows ``rows`` of X (CSR) is within
    ``ovr_work_cap(max_work)``."""
    terms = np.minimum(np.diff(X.indptr)[rows], MAX_ROW_TERMS).sum()
    return float(terms) * n_labels * OVR_EPOCHS <= ovr_work_cap(max_work)


def kept_features(X, n_labels, max_weights=None):
    """slot int32 [n_features]: the weight row of each of the ``max_weights // n_labels``
    (``MAX_OVR_WEIGHTS``) features of X (CSR) in the most rows (ties: the lower id), -1 for
    the others and for features in no row."""
    max_weights = MAX_OVR_WEIGHTS if max_weights is None else int(max_weights)
    df = np.bincount(X.indices, minlength=X.shape[1])
    n_keep = int(min((df > 0).sum(), max(1, max_weights // max(1, n_labels))))
    keep = np.sort(np.argsort(-df, kind="stable")[:n_keep])
    slot = np.full(X.shape[1], -1, np.int32)
    slot[keep] = np.arange(n_keep, dtype=np.int32)
    return slot


class OneVsRest:
    """The fitted one-vs-rest classifiers: ``weights`` float32 [kept features, n_labels],
    ``slot`` int32 [n_features] (each feature's row of weights, -1: none) and ``bias`` float32
    [n_labels]."""

    def __init__(self, weights, slot, bias):
        self.weights = np.ascontiguousarray(weights, np.float32)
        self.slot = np.asarray(slot, np.int32)
        self.bias = np.asarray(bias, np.float32)

    @classmethod
    def fit(cls, X, Y, rows, seed=0, max_weights=None):
        """``OVR_EPOCHS`` passes over the rows ``rows`` of X, Y (CSR), in a seeded order; at
        most ``max_weights`` weights (``kept_features``)."""
        rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x0F12])
        Xr = strongest_terms(take_rows(X, np.asarray(rows, np.int64)))
        Yr = take_rows(Y, np.asarray(rows, np.int64))
        n_labels = Y.shape[1]
        slot = kept_features(Xr, n_labels, max_weights)
        weights = np.zeros((int(slot.max()) + 1, n_labels), np.float32)
        y_ids = Yr.indices.astype(np.int64)
        counts = np.bincount(y_ids, minlength=n_labels).astype(np.float64)
        bias = np.log((counts + 0.5) / (Xr.shape[0] + 1.0)).astype(np.float32)
        sums = (np.zeros(weights.shape[0]), np.zeros(n_labels), np.zeros(1),)
        bias_g2 = np.zeros(n_labels, np.float32)
        args = (Xr.indptr.astype(np.int64), Xr.indices.astype(np.int32, copy=False),
                Xr.data.astype(np.float32, copy=False), slot, Yr.indptr.astype(np.int64),
                y_ids)
        n_parts = numba.get_num_threads()
        for _ in range(OVR_EPOCHS):
            ovr_epoch(*args, rng.permutation(Xr.shape[0]), weights, *sums, bias, bias_g2,
                      np.float32(OVR_LEARNING_RATE), n_parts)
        return cls(weights, slot, bias)

    def score_into(self, X, cand_ptr, counts, ids, F, col):
        """``F[u, col]``: the score of each used candidate slot u (rows of X)."""
        self._score_into(X, cand_ptr, counts, ids, F, col, np.zeros(0, np.int64))

    def _score_into(self, X, cand_ptr, counts, ids, F, col, column_of):
        X = strongest_terms(X)
        score_ovr(cand_ptr, counts, ids, X.indptr.astype(np.int64),
                  X.indices.astype(np.int32, copy=False), X.data.astype(np.float32, copy=False),
                  self.slot, self.weights, self.bias, F, int(col), column_of)

    def state(self):
        return {"ovr_weights": self.weights, "ovr_slot": self.slot, "lin_bias": self.bias}


def negatives_by_neighbours(n_use, n_labels, n_neighbours):
    """Whether ``LabelLinear.fit`` takes a row's hard negatives from its neighbours among the
    ``n_use`` rows it trains on (n_use dot products a row) rather than from the network's
    logits (``n_labels``): where that is cheaper and there is a vote to imitate."""
    return n_neighbours > 0 and n_use < n_labels


def fit_classifiers(output, H, X, Y, rows, seed=0, n_neighbours=0, max_ovr_work=None):
    """The linear_score classifiers of the rows ``rows`` of X, Y: ``OneVsRest`` where it is
    affordable (``ovr_affordable`` within ``max_ovr_work``), else ``LabelLinear`` against hard
    negatives (the network's top labels, or the labels of a row's ``n_neighbours`` nearest
    rows: ``LabelLinear.fit``)."""
    if ovr_affordable(X, np.asarray(rows, np.int64), Y.shape[1], max_ovr_work):
        return OneVsRest.fit(X, Y, rows, seed)
    return LabelLinear.fit(output, H, X, Y, rows, seed, n_neighbours)


def classifiers_from_state(d, n_labels, n_features):
    """The classifiers saved by ``state`` (``ovr_*`` keys: ``OneVsRest``, else ``LabelLinear``);
    ValueError naming what is wrong."""
    b = d.get("lin_bias")
    if b is None or b.dtype != np.float32 or b.shape != (n_labels,) \
            or not np.isfinite(b).all():
        raise ValueError("the linear classifiers need one finite float32 bias per label")
    if "ovr_weights" in d:
        w, slot = d["ovr_weights"], d.get("ovr_slot")
        if slot is None or slot.dtype != np.int32 or slot.shape != (n_features,):
            raise ValueError(f"the one-vs-rest slots must be {n_features} int32 values")
        if w.dtype != np.float32 or w.ndim != 2 or w.shape[1] != n_labels \
                or not np.isfinite(w).all():
            raise ValueError("the one-vs-rest weights must be finite float32 "
                             f"[features, {n_labels}]")
        if slot.min() < -1 or slot.max() >= w.shape[0]:
            raise ValueError(f"the one-vs-rest slots must lie in [-1, {w.shape[0]})")
        return OneVsRest(w, slot, b)
    w = d.get("lin_weights")
    if w is None or w.dtype != np.float32 or w.ndim != 1 or w.shape[0] < 2 \
            or w.shape[0] & (w.shape[0] - 1) or not np.isfinite(w).all():
        raise ValueError("the linear classifiers must be finite float32 weights (a "
                         "power-of-two table)")
    return LabelLinear(w, b)
