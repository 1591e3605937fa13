"""The word neighbours: a query's nearest training rows by the cosine of their input vectors
(the words, not the hidden layer), for the re-ranker's ``word_vote`` feature.

The neighbour vote of ``slide.rank.vote`` finds a row's nearest training rows in the network's
128-wide hidden layer: a metric the network learned, blind to a rare word it had no room for.
The label trees work on the input words directly, and so does a plain k-nearest-neighbour vote
over them: on debcontents (133k labels) the labels of a test row's 20 nearest training rows by
input cosine put a true label first for 56 % of the rows, 59 % with 50 of them, against 56 %
for the network alone, and the two err on different rows. Taken as sign(v) |v| ** 0.5 before
the cosine (``VALUE_POWER``), the inputs' values do better: 61 % with 20 rows (tf-idf weighs a
rare word too heavily here: binary inputs gave 61 % too, |v| ** 2 45 %). So the re-ranker
gets the words' vote as a feature of its own (``word_vote``, ``slide.rank.candidates``); the
labels of the ``NEW_ROWS`` nearest also join a row's candidates (default none: on
debcontents, paired on two networks, the vote as a feature gained 0.4 and 0.7 points of P@1,
and with all 20 rows' labels among the candidates +0.2 and -0.6: more candidates of little
else to go on).

The index is the training rows' unit-L2 inputs transposed: for each word, the rows that hold it
and its weight there (``ptr`` int64 [n_features + 1], ``rows`` int32, ``vals`` float32). A query
walks the lists of its own words, adding weight products into one accumulator per task, so it
costs the summed length of those lists (debcontents: ~265k products a query, 2.6 s for its 8.5k
test rows on 2 cores). Where the inputs hold more than ``MAX_ENTRIES`` entries, a seeded subset
of the rows is indexed (Amazon-670K's 490k rows of 75 words: 37M entries, 0.3 GB, where the
whole fit must stay under 2.5 GB).
"""
import numpy as np

from slide import defaults
from slide.kernels.arrays import Csr
from slide.kernels.jit import njit
from slide.kernels.threads import on_row_slices
from slide.kernels.topk import insert_best_first

STATE_FORMAT = 1
K = defaults.WORD_NEIGHBOURS
NEW_ROWS = defaults.WORD_NEW_ROWS          # the nearest whose labels join the candidates
VALUE_POWER = defaults.WORD_VALUE_POWER    # sign(v) |v| ** VALUE_POWER: the values searched
POWER = defaults.WORD_POWER
MAX_ENTRIES = defaults.WORD_MAX_ENTRIES


@njit(cache=True, nogil=True)
def _flatten(v, power):
    """sign(v) |v| ** power: an input value as the search weighs it."""
    if power == 1.0:
        return v
    a = abs(v) ** power
    return a if v >= 0 else -a


@njit(cache=True)
def _transpose(x_ptr, x_ind, x_dat, keep, power, n_features, ptr, rows, vals):
    """The kept rows of the CSR input (x_ptr, x_ind, x_dat), their values flattened
    (``_flatten``) and each row scaled to unit L2 norm, written word by word into
    (ptr, rows, vals): a counting sort, rows ascending."""
    for r in range(keep.shape[0]):
        if keep[r]:
            for p in range(x_ptr[r], x_ptr[r + 1]):
                ptr[x_ind[p] + 1] += 1
    for f in range(n_features):
        ptr[f + 1] += ptr[f]
    fill = ptr[:-1].copy()
    for r in range(keep.shape[0]):
        if not keep[r]:
            continue
        norm = 0.0
        for p in range(x_ptr[r], x_ptr[r + 1]):
            v = _flatten(np.float64(x_dat[p]), power)
            norm += v * v
        scale = 1.0 / np.sqrt(norm) if norm > 0.0 else 0.0
        for p in range(x_ptr[r], x_ptr[r + 1]):
            f = x_ind[p]
            rows[fill[f]] = r
            vals[fill[f]] = _flatten(np.float64(x_dat[p]), power) * scale
            fill[f] += 1


@njit(cache=True, nogil=True)
def _nearest_rows(query, power, index, excluded, k, lo, hi, near, sims):
    """Each query row r in lo..hi-1's k best memory rows by the cosine of the inputs (best
    first; -1 / -inf beyond the rows that share a word with it), the ``excluded`` memory rows
    left out. ``query`` and ``index`` are ``Csr`` bundles (the index word by word); the
    query's values are flattened as the index's were. One accumulator over the memory rows
    and the list of those a query touched."""
    q_ptr, q_ind, q_dat = query.ptr, query.ind, query.dat
    ptr, rows, vals = index.ptr, index.ind, index.dat
    n_rows = excluded.shape[0]
    n_words = ptr.shape[0] - 1
    acc = np.zeros(n_rows, np.float32)
    seen = np.zeros(n_rows, np.bool_)
    touched = np.empty(n_rows, np.int32)
    for r in range(lo, hi):
        norm = 0.0
        for p in range(q_ptr[r], q_ptr[r + 1]):
            v = _flatten(np.float64(q_dat[p]), power)
            norm += v * v
        scale = 1.0 / np.sqrt(norm) if norm > 0.0 else 0.0
        m = 0
        for p in range(q_ptr[r], q_ptr[r + 1]):
            f = q_ind[p]
            if f >= n_words:
                continue        # a word no training row held when the index was built
            v = np.float32(_flatten(np.float64(q_dat[p]), power) * scale)
            for t in range(ptr[f], ptr[f + 1]):
                i = rows[t]
                if not seen[i]:
                    seen[i] = True
                    touched[m] = i
                    m += 1
                acc[i] += v * vals[t]
        ids, best = near[r], sims[r]      # views made once a row, not once a touched row
        ids[:] = -1
        best[:] = -np.inf
        for t in range(m):
            i = touched[t]
            if not excluded[i] and acc[i] > best[k - 1]:
                insert_best_first(acc[i], np.int64(i), k, ids, best)   # int64: one compile
            acc[i] = 0.0
            seen[i] = False


class WordIndex:
    """The unit-L2 inputs of (some of) the training rows, word by word; ``n_rows``: the
    memory's row count (row ids index its labels, ``slide.rank.vote.NeighbourMemory``);
    ``value_power`` and ``k``: how its values were flattened and how many neighbours a query
    gets, as built (a saved model keeps them whatever the defaults become)."""

    def __init__(self, ptr, rows, vals, n_rows, value_power=1.0, k=K):
        self.ptr, self.rows, self.vals = ptr, rows, vals
        self.n_rows = int(n_rows)
        self.value_power = float(value_power)
        self.k = int(k)

    @classmethod
    def build(cls, X, seed=0, max_entries=None, value_power=None, k=None):
        """From the training inputs X (CSR [n_rows, n_features]), each value v taken as
        sign(v) |v| ** ``value_power`` (default ``VALUE_POWER``), its queries' ``k``
        neighbours (default ``K``); where they hold more than ``max_entries`` (default
        ``MAX_ENTRIES``) entries, a seeded draw of rows holding about that many."""
        max_entries = MAX_ENTRIES if max_entries is None else int(max_entries)
        power = VALUE_POWER if value_power is None else float(value_power)
        n = X.shape[0]
        keep = np.ones(n, np.bool_)
        if X.nnz > max_entries:
            order = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x30D5]).permutation(n)
            lens = np.diff(X.indptr)[order]
            keep[:] = False
            keep[order[np.cumsum(lens) <= max_entries]] = True
        x_ptr = X.indptr.astype(np.int64)
        n_entries = int(np.diff(x_ptr)[keep].sum())
        ptr = np.zeros(X.shape[1] + 1, np.int64)
        rows = np.empty(n_entries, np.int32)
        vals = np.empty(n_entries, np.float32)
        _transpose(x_ptr, X.indices.astype(np.int32, copy=False),
                   X.data.astype(np.float32, copy=False), keep, power, X.shape[1], ptr, rows,
                   vals)
        return cls(ptr, rows, vals, n, power, K if k is None else k)

    def nbytes(self):
        return self.ptr.nbytes + self.rows.nbytes + self.vals.nbytes

    def nearest(self, X, k=None, exclude=None):
        """Each row of X's ``min(k, n_rows)`` (k: the index's ``k``) nearest indexed rows by
        input cosine, best first: (ids [n, k] int64, similarities [n, k] float32), -1 / -inf
        where fewer rows share a word with it. ``exclude``: memory rows never returned."""
        k = int(min(self.k if k is None else k, self.n_rows))
        n = X.shape[0]
        near = np.empty((n, k), np.int64)
        sims = np.empty((n, k), np.float32)
        excluded = np.zeros(self.n_rows, np.bool_)
        if exclude is not None:
            excluded[np.asarray(exclude, np.int64)] = True
        if n and k:
            # one slice of the rows a thread (``threads.on_row_slices``): each holds
            # accumulators over every memory row (9 bytes a row, 35 MB at Amazon-670K's 490k
            # rows for 8 tasks, at the top of the fit's peak)
            query = Csr(X.indptr.astype(np.int64), X.indices.astype(np.int32, copy=False),
                        X.data.astype(np.float32, copy=False))
            index = Csr(self.ptr, self.rows, self.vals)
            on_row_slices(n, lambda lo, hi: _nearest_rows(query, self.value_power, index,
                                                          excluded, k, lo, hi, near, sims))
        return near, sims

    # -- state ---------------------------------------------------------------------------------
    def state(self):
        """The arrays a re-ranker's state holds (``words_*``)."""
        return {"words_format": STATE_FORMAT, "words_n_rows": self.n_rows,
                "words_value_power": self.value_power, "words_k": self.k,
                "words_ptr": self.ptr, "words_rows": self.rows, "words_vals": self.vals}

    @classmethod
    def from_state(cls, d, n_features):
        """ValueError naming what is wrong with a saved index."""
        if int(d.get("words_format", -1)) != STATE_FORMAT:
            raise ValueError(f"unsupported word index format {d.get('words_format')!r}")
        ptr, rows, vals = d["words_ptr"], d["words_rows"], d["words_vals"]
        n_rows = int(d["words_n_rows"])
        if (ptr.dtype != np.int64 or ptr.shape != (n_features + 1,) or ptr[0] != 0
                or (np.diff(ptr) < 0).any() or ptr[-1] != rows.shape[0]
                or vals.shape != rows.shape):
            raise ValueError("word index: ptr does not fit the feature count")
        if rows.dtype != np.int32 or (rows.size and (rows.min() < 0 or rows.max() >= n_rows)):
            raise ValueError(f"word index: row ids outside [0, {n_rows})")
        if vals.dtype != np.float32 or not np.isfinite(vals).all():
            raise ValueError("word index: values must be finite float32")
        power = d.get("words_value_power")
        if not isinstance(power, (float, int)) or not 0.0 < float(power) <= 4.0:
            raise ValueError(f"word index: value_power must lie in (0, 4], got {power!r}")
        k = d.get("words_k")
        if not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"word index: k must be a positive integer, got {k!r}")
        return cls(ptr, rows, vals, n_rows, power, k)
