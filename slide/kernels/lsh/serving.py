"""The serving index: LSH tables over a trained output layer, for sparse top-k inference.

Training tables (``slide.kernels.lsh.index``) are sized for sampling while the weights move; serving
wants the opposite: the weights are frozen, the index is built once, and the goal is to find
each row's highest logits ``z_j = w_j . h + b_j`` while scoring a small share of the labels.

Design (chosen by measured recall at fixed cost, ``bench/serving.py``):

* MIPS transform with norm ranging (Simple-LSH, Neyshabur & Srebro 2015; norm-ranging LSH,
  Yan et al. 2018): a label's vector is ``x_j = [w_j - mean(w) ; b_j - max(b)]``, so that
  ``x_j . [h ; 1]`` is ``z_j`` minus the same amount for every label of the row.
  The labels are split into ``n_ranges`` groups of equal size by ``|x_j|``; in group s,
  ``x_j / M_s`` (M_s: the group's largest norm) is augmented with ``sqrt(1 - |x_j / M_s|^2)``
  so every indexed vector has norm 1 and its angle to the query ``[h ; 1] / |[h ; 1]|``
  (augmented with 0) falls as the inner product grows. One group (Simple-LSH) lets the few
  largest norms squash every other label toward the augmented axis; ranges keep each group's
  angles informative.
* SimHash (signed Gaussian projections), ``n_bits`` bits per table, ``n_tables`` tables, each a
  CSR over its ``2**n_bits`` buckets holding every label (no cap: nothing moves at serving).
* Per query: count each label's collisions over the tables, keep the ``n_candidates`` labels
  that collide most, score them exactly (``w_j . h + b_j``) and return the best k. The
  optional prior list (the highest-bias labels, the same for every row) is scored first, with
  BLAS, and the candidates are taken from outside it.

Measured (``bench/results/serving.md``): at 200k labels the index alone recalls 5-15 % of the
exact top-5 at >= 10x exact's speed; the prior list carries the recall (0.90 with 4,096
labels). The index is kept because it is cheap and sampler-independent, not because the LSH
finds the top logits.

Memory: ``n_tables * (N + 2**n_bits + 1)`` int32 plus the projections; it is rebuilt from the
weights on demand and saved in checkpoints (``slide.persist.checkpoint``)."""
import math

import numba
import numpy as np
from numba import prange

from slide.kernels.jit import njit
from slide.kernels.rng import SERVING_INDEX_KEY
from slide.kernels.topk import insert_best_first


STATE_FORMAT = 1
# below this many labels the index is not worth building (see ``serving_config``)
MIN_LABELS = 2


@njit(cache=True, nogil=True)
def _score(W, b, j, h):
    acc = b[j]
    for d in range(h.shape[0]):
        acc += W[j, d] * h[d]
    return acc


@njit(cache=True, nogil=True)
def _count_collisions(codes_row, offsets, items, skip, count, touched):
    """count[j] += 1 for every label j (not marked in ``skip``) in the query's bucket of each
    table; the distinct labels seen go to ``touched``. Returns how many."""
    nt = 0
    for t in range(codes_row.shape[0]):
        c = codes_row[t]
        for p in range(offsets[t, c], offsets[t, c + 1]):
            j = items[t, p]
            if skip[j]:
                continue
            if count[j] == 0:
                touched[nt] = j
                nt += 1
            count[j] += 1
    return nt


@njit(cache=True, nogil=True)
def _count_threshold(count, touched, nt, n_tables, n_cand, hist):
    """(t, n_above): the labels with count > t number n_above < n_cand, and adding those with
    count == t reaches n_cand (or t = 1 when all touched labels fit)."""
    hist[:] = 0
    for a in range(nt):
        hist[count[touched[a]]] += 1
    above = 0
    t = n_tables
    while t > 1 and above + hist[t] < n_cand:
        above += hist[t]
        t -= 1
    return t, above


@njit(cache=True, nogil=True)
def _serve_row(codes_row, offsets, items, W, b, h, n_cand, skip, k, count, touched, hist,
               ids, scores):
    """Insert the row's ``n_cand`` most-colliding labels outside ``skip`` (the prior list,
    already scored) into its best-first top-k lists ``ids`` / ``scores``."""
    if n_cand <= 0:
        return
    nt = _count_collisions(codes_row, offsets, items, skip, count, touched)
    t, above = _count_threshold(count, touched, nt, offsets.shape[0], n_cand, hist)
    at_t = n_cand - above       # how many labels with count == t still fit
    for a in range(nt):
        j = touched[a]
        c = count[j]
        count[j] = 0
        if c > t or (c == t and at_t > 0):
            if c == t:
                at_t -= 1
            insert_best_first(_score(W, b, j, h), j, k, ids, scores)


@njit(cache=True, nogil=True, parallel=True)
def serve_topk_kernel(codes, offsets, items, W, b, H, n_cand, skip, k, count, touched, hist,
                      out_ids, out_scores):
    """Rows in parallel (one scratch row of ``count``/``touched``/``hist`` per chunk; ``count``
    is all zeros on entry and on exit). ``out_ids``/``out_scores`` hold each row's top-k so
    far (the prior list's, or -1 / -inf) and receive the LSH candidates'."""
    n = H.shape[0]
    n_chunks = count.shape[0]
    for c in prange(n_chunks):
        for s in range((c * n) // n_chunks, ((c + 1) * n) // n_chunks):
            _serve_row(codes[s], offsets, items, W, b, H[s], n_cand, skip, k, count[c],
                       touched[c], hist[c], out_ids[s], out_scores[s])


def prior_topk(H, Wo, bo, prior, k, block=1024):
    """(ids int64 [n, k], scores float32 [n, k]): each row's top-k among the ``prior`` labels,
    scored with BLAS; -1 / -inf where the list has fewer than k."""
    n = H.shape[0]
    ids = np.full((n, k), -1, np.int64)
    scores = np.full((n, k), -np.inf, np.float32)
    kk = min(k, prior.shape[0])
    if kk == 0:
        return ids, scores
    Wp, bp = Wo[prior], bo[prior]
    for lo in range(0, n, block):
        S = H[lo:lo + block] @ Wp.T + bp
        part = np.argpartition(-S, kk - 1, axis=1)[:, :kk] if kk < S.shape[1] else \
            np.broadcast_to(np.arange(S.shape[1]), S.shape)
        ps = np.take_along_axis(S, part, axis=1)
        order = np.argsort(-ps, axis=1, kind="stable")
        ids[lo:lo + block, :kk] = prior[np.take_along_axis(part, order, axis=1)]
        scores[lo:lo + block, :kk] = np.take_along_axis(ps, order, axis=1)
    return ids, scores


@njit(cache=True, nogil=True, parallel=True)
def build_tables_kernel(codes, offsets, items):
    """Counting sort of the labels by bucket, one prange task per table: table t's bucket u
    holds ``items[t, offsets[t, u]:offsets[t, u + 1]]`` in increasing label order."""
    N, L = codes.shape
    nb = offsets.shape[1] - 1
    for t in prange(L):
        cnt = np.zeros(nb + 1, np.int64)
        for j in range(N):
            cnt[codes[j, t] + 1] += 1
        for u in range(nb):
            cnt[u + 1] += cnt[u]
        for u in range(nb + 1):
            offsets[t, u] = cnt[u]
        for j in range(N):
            u = codes[j, t]
            items[t, cnt[u]] = j
            cnt[u] += 1


def serving_config(n_labels, dim, n_bits=None, n_tables=None, n_candidates=None,
                   n_ranges=None):
    """The index's parameters, derived from the label count and the hidden width unless
    given (``dim`` does not enter: at the shapes measured the best settings did not move with
    it): ~256 labels per bucket (``n_bits = log2(n_labels / 256)``: fewer bits touch more
    labels than the re-scoring saves), 32 tables, 0.25 % of the labels re-scored (at least
    128), up to 16 norm ranges (``bench/results/serving.md``). ``n_candidates`` may be 0 (the
    prior list alone). Raises ValueError on a bad override."""
    n = int(n_labels)
    cfg = dict(
        n_bits=max(1, min(20, int(round(math.log2(max(2.0, n / 256.0)))))),
        n_tables=32,
        n_candidates=max(min(n, 128), int(math.ceil(n / 400))),
        n_ranges=max(1, min(16, n // 1024)))
    for name, v in (("n_bits", n_bits), ("n_tables", n_tables),
                    ("n_candidates", n_candidates), ("n_ranges", n_ranges)):
        if v is None:
            continue
        low = 0 if name == "n_candidates" else 1
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
            raise ValueError(f"serving index: {name} must be an integer >= {low}, got {v!r}")
        cfg[name] = int(v)
    if cfg["n_bits"] > 24:
        raise ValueError(f"serving index: n_bits must be at most 24, got {cfg['n_bits']}")
    if cfg["n_tables"] > 255:
        raise ValueError(f"serving index: n_tables must be at most 255, got {cfg['n_tables']}")
    cfg["n_ranges"] = min(cfg["n_ranges"], n)
    cfg["n_candidates"] = min(cfg["n_candidates"], n)
    return cfg


def default_prior(n_labels):
    """How many highest-bias labels sparse serving scores by default: 2 % of the labels, at
    least 256 (at 200k labels the 4,000 most frequent hold ~90 % of the exact top-5)."""
    n = int(n_labels)
    return min(n, max(256, int(math.ceil(n / 50))))


def _codes(X, P, n_bits, n_tables, block=16384):
    """int32 [n, n_tables] bucket ids of the rows of X under the projections P."""
    out = np.empty((X.shape[0], n_tables), np.int32)
    weights = (1 << np.arange(n_bits, dtype=np.int64)).astype(np.int32)
    for lo in range(0, X.shape[0], block):
        bits = (X[lo:lo + block] @ P.T > 0).reshape(-1, n_tables, n_bits)
        out[lo:lo + block] = bits.astype(np.int32) @ weights
    return out


def _mips_blocks(Wo, bo, n_ranges, block=1 << 16):
    """``mips_items`` block by block: yields (lo, hi, float32 rows lo..hi-1). The float64
    work is done one block at a time (the whole [N, dim + 2] in float64, several copies of it,
    was 2 GB at 670k labels); each row's values are exactly those of the whole-array form."""
    n, dim = Wo.shape
    mean = Wo.mean(axis=0, dtype=np.float64)
    shifted_b = bo - bo.max()            # float32, as the whole-array form computed it

    def centred(lo, hi):
        return np.hstack([Wo[lo:hi] - mean, shifted_b[lo:hi, None].astype(np.float64)])

    norms = np.empty(n, np.float64)
    for lo in range(0, n, block):
        norms[lo:lo + block] = np.linalg.norm(centred(lo, min(n, lo + block)), axis=1)
    order = np.argsort(norms, kind="stable")
    group = np.arange(n, dtype=np.int64) * n_ranges // n       # by rank, ascending norm
    last = np.searchsorted(group, group, side="right") - 1      # each group's largest norm
    scale = np.empty_like(norms)
    scale[order] = np.maximum(norms[order][last], 1e-30)
    for lo in range(0, n, block):
        hi = min(n, lo + block)
        X = centred(lo, hi)
        X /= scale[lo:hi, None]
        aug = np.sqrt(np.maximum(0.0, 1.0 - (norms[lo:hi] / scale[lo:hi]) ** 2))
        yield lo, hi, np.hstack([X, aug[:, None]]).astype(np.float32)


def mips_items(Wo, bo, n_ranges):
    """[w_j - mean(w) ; b_j - max(b)] / M_s(j) augmented to unit norm, with the labels split
    into ``n_ranges`` equal groups by norm: float32 [N, dim + 2]. Subtracting the mean weight
    row and the largest bias shifts every logit of a row by the same amount (the ranking is
    unchanged) and moves the label vectors off the one common direction they share after
    training (measured: it doubles the recall of SimHash over the raw [w ; b])."""
    out = np.empty((Wo.shape[0], Wo.shape[1] + 2), np.float32)
    for lo, hi, X in _mips_blocks(Wo, bo, n_ranges):
        out[lo:hi] = X
    return out


def mips_queries(H):
    """[h ; 1] / |[h ; 1]| augmented with 0: float32 [n, dim + 2]."""
    Q = np.hstack([H, np.ones((H.shape[0], 1), np.float32), np.zeros((H.shape[0], 1),
                                                                     np.float32)])
    Q /= np.linalg.norm(Q, axis=1, keepdims=True)
    return Q.astype(np.float32)


class ServingIndex:
    """LSH tables over an output layer's [w ; b] for sparse top-k (see the module doc).
    ``ServingIndex.build(Wo, bo, seed=0, **overrides)``; ``topk(H, Wo, bo, k, prior)``."""

    def __init__(self, n_labels, dim, n_bits, n_tables, n_candidates, n_ranges, seed,
                 projections, offsets, items):
        self.n_labels, self.dim = int(n_labels), int(dim)
        self.n_bits, self.n_tables = int(n_bits), int(n_tables)
        self.n_candidates, self.n_ranges = int(n_candidates), int(n_ranges)
        self.seed = int(seed)
        self.projections, self.offsets, self.items = projections, offsets, items

    @classmethod
    def build(cls, Wo, bo, seed=0, **overrides):
        Wo = np.asarray(Wo, np.float32)
        bo = np.asarray(bo, np.float32)
        n, dim = Wo.shape
        cfg = serving_config(n, dim, **overrides)
        rng = np.random.default_rng([int(seed), SERVING_INDEX_KEY])
        P = rng.standard_normal((cfg["n_bits"] * cfg["n_tables"], dim + 2)).astype(np.float32)
        # the items' codes block by block: the [N, dim + 2] items are never whole
        codes = np.empty((n, cfg["n_tables"]), np.int32)
        for lo, hi, X in _mips_blocks(Wo, bo, cfg["n_ranges"]):
            codes[lo:hi] = _codes(X, P, cfg["n_bits"], cfg["n_tables"])
        offsets = np.zeros((cfg["n_tables"], 2 ** cfg["n_bits"] + 1), np.int32)
        items = np.zeros((cfg["n_tables"], n), np.int32)
        build_tables_kernel(np.ascontiguousarray(codes), offsets, items)
        return cls(n, dim, seed=seed, projections=P, offsets=offsets, items=items, **cfg)

    def config(self):
        return dict(n_bits=self.n_bits, n_tables=self.n_tables,
                    n_candidates=self.n_candidates, n_ranges=self.n_ranges)

    def set_candidates(self, n_candidates):
        """Change how many labels a query re-scores (the tables stay)."""
        self.n_candidates = serving_config(self.n_labels, self.dim,
                                           n_candidates=n_candidates)["n_candidates"]

    def fits(self, Wo):
        return Wo.shape == (self.n_labels, self.dim)

    def codes(self, H):
        return _codes(mips_queries(H), self.projections, self.n_bits, self.n_tables)

    def topk(self, H, Wo, bo, k, prior=None, n_candidates=None, n_chunks=None):
        """(ids int64 [n, k], scores float32 [n, k]) best first, -1 / -inf where fewer than k
        labels were scored: the ``prior`` labels (the same for every row; scored with BLAS)
        and each row's ``n_candidates`` most-colliding labels (0: the prior list alone)."""
        n_chunks = int(n_chunks or numba.get_num_threads())
        n_cand = self.n_candidates if n_candidates is None else int(n_candidates)
        prior = np.zeros(0, np.int64) if prior is None else np.asarray(prior, np.int64)
        H = np.ascontiguousarray(H, np.float32)
        out_ids, out_scores = prior_topk(H, Wo, bo, prior, int(k))
        skip = np.zeros(self.n_labels, np.bool_)
        skip[prior] = True
        count = np.zeros((n_chunks, self.n_labels), np.int16)
        touched = np.empty((n_chunks, self.n_labels), np.int32)
        hist = np.zeros((n_chunks, self.n_tables + 1), np.int64)
        serve_topk_kernel(self.codes(H), self.offsets, self.items, Wo, bo, H, n_cand, skip,
                          int(k), count, touched, hist, out_ids, out_scores)
        return out_ids, out_scores

    def memory_bytes(self):
        return int(self.projections.nbytes + self.offsets.nbytes + self.items.nbytes)

    def state_dict(self):
        """JSON-able settings plus the arrays ``projections``, ``offsets``, ``items``."""
        d = dict(format=STATE_FORMAT, n_labels=self.n_labels, dim=self.dim, seed=self.seed,
                 **self.config())
        d.update(projections=self.projections, offsets=self.offsets, items=self.items)
        return d

    @classmethod
    def from_state(cls, d):
        """The index of :meth:`state_dict`; ValueError naming what does not fit."""
        if d.get("format") != STATE_FORMAT:
            raise ValueError(f"serving index format {d.get('format')!r} is not supported")
        ix = cls(d["n_labels"], d["dim"], d["n_bits"], d["n_tables"], d["n_candidates"],
                 d["n_ranges"], d["seed"], np.asarray(d["projections"], np.float32),
                 np.asarray(d["offsets"], np.int32), np.asarray(d["items"], np.int32))
        L, nb = ix.n_tables, 2 ** ix.n_bits
        if ix.projections.shape != (ix.n_bits * L, ix.dim + 2):
            raise ValueError("serving index: projections do not fit n_bits, n_tables, dim")
        if ix.offsets.shape != (L, nb + 1) or ix.items.shape != (L, ix.n_labels):
            raise ValueError("serving index: tables do not fit n_bits, n_tables, n_labels")
        if (ix.offsets[:, 0] != 0).any() or (ix.offsets[:, -1] != ix.n_labels).any() or \
                (np.diff(ix.offsets, axis=1) < 0).any():
            raise ValueError("serving index: table offsets are not a CSR over every label")
        if ix.items.size and (ix.items.min() < 0 or ix.items.max() >= ix.n_labels):
            raise ValueError("serving index: table items out of range")
        return ix
