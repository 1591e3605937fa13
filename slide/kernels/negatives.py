"""Shared negatives of a batch, their importance weights, and the sampling correction.

Every sample of a batch gets the same ``n_shared`` negative output neurons forced into its
active set, drawn uniformly or (``negative_power`` > 0) with probability
q_j ~ (count_j + 1)^power, so the frequent labels -- which hold most of the softmax's mass --
are almost always present. The softmax over a sample's active set then estimates the full one
by offsetting the logits of the neurons that stand for the rest (the logQ correction of TF's
sampled softmax), see :func:`correction`.
"""
import math
from typing import NamedTuple

import numpy as np
from numba import prange

from slide.kernels.arrays import DrawTables, SharedDraw
from slide.kernels.jit import njit
from slide.kernels.layers import FASTMATH
from slide.kernels.prefetch import prefetch_line
from slide.kernels.rng import SHARED_NEGATIVES_KEY


@njit(cache=True, nogil=True, inline="always")
def find_sorted(a, j):
    """Position of ``j`` in the sorted distinct ids ``a`` (binary search), -1 if absent."""
    lo = 0
    hi = a.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        v = a[mid]
        if v < j:
            lo = mid + 1
        elif v > j:
            hi = mid
        else:
            return mid
    return -1


@njit(cache=True, nogil=True, inline="always")
def seek_sorted(a, j, lo):
    """``find_sorted(a, j)`` for ids visited mostly in ascending order: (position of ``j`` in
    the sorted distinct ids ``a`` or -1, the cursor for the next id). Every a[:lo] is below
    the previous id; from there the search gallops forward (1, 2, 4... places, then a binary
    search in the last gap), so a walk over a sample's sorted active ids costs about the log
    of each gap, where a full binary search per id cost ~10-13 mispredicted branches (C's
    ids, a sample's labels, are looked up in S and among the labels: a debcontents row holds
    up to 9,076 of them). An id below the cursor (out of order: an LSH candidate, a random
    fill) takes the full search and leaves the cursor. The same positions as
    ``find_sorted``, so the same bits."""
    n = a.shape[0]
    if lo > 0 and a[lo - 1] >= j:
        return find_sorted(a, j), lo
    if lo < n and a[lo] < j:
        prev = lo
        step = 1
        cur = lo + 1
        while cur < n and a[cur] < j:
            prev = cur
            step <<= 1
            cur = prev + step
        lo = prev + 1
        hi = min(cur, n)
        while lo < hi:
            mid = (lo + hi) >> 1
            if a[mid] < j:
                lo = mid + 1
            else:
                hi = mid
    if lo < n and a[lo] == j:
        return lo, lo
    return -1, lo


@njit(cache=True, nogil=True, inline="always")
def is_label(labels, j):
    """Whether ``j`` is one of the sorted label ids of one sample."""
    return find_sorted(labels, j) >= 0


# which per-neuron offset array ``correction`` applies to [lo1, hi1): none, ``corr`` (-log pi),
# ``corr_mix`` (log((1 + 1/pi) / 2)); the batched engine precomputes the block's offsets per kind
CORR_NONE, CORR_PLAIN, CORR_MIX = 0, 1, 2


class OffsetRanges(NamedTuple):
    """A sample's logit offsets (``correction_kind``): positions [lo1, hi1) get log_w1 (plus
    the kind's per-neuron entry), positions [lo2, hi2) get log_w2."""
    lo1: int
    hi1: int
    lo2: int
    hi2: int
    log_w1: float
    log_w2: float


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def correction_kind(spec, n_a, n_c, n_s, neg, enabled):
    """Logit offsets of one sample's sampled softmax: (``OffsetRanges``, kind): positions
    [lo1, hi1) get log_w1 (+ the neuron's entry of ``neg.corr`` for kind CORR_PLAIN, of
    ``neg.corr_mix`` for CORR_MIX), positions [lo2, hi2) get log_w2.

    Layout of the active set (``sample.select_active``): C = [0, n_c) the labels and the LSH
    ids, chosen without looking at the shared draw S; [n_c, n_s) the ids of S not in C;
    [n_s, n_a) uniform random fill from outside C and S. The softmax normaliser
    Z^ = sum over the active set of exp(z_j + offset_j) is then an unbiased estimate of the
    full sum_j exp(z_j) (``neg``: the batch's ``SharedDraw``; E over S and the fill):

    * C is computed exactly (offset 0): nothing of it is estimated, so counted once.
    * Frequency draws (``neg.corr`` not empty; pi_j = 1 - (1 - q_j)^n for n draws): S estimates
      all the mass outside C by Horvitz-Thompson, each j in S \\ C weighted 1 / pi_j.
    * A fill F of f ids next to frequency draws: given S, (U'/f) sum_F exp(z) with
      U' = n_out - n_s is unbiased for the mass outside C and S. Mixing the two with weight
      1/2 (shared j: (1 + 1/pi_j)/2, i.e. ``corr_mix``; fill: U'/(2f)) is unbiased only if
      the fill is non-empty for EVERY draw, i.e. n_a - n_c > n (|S| <= n): then it is used.
      Otherwise (the fill exists for some draws only, and which depends on S) no fixed weight
      of it is unbiased without P(fill non-empty), so the fill is dropped from the estimate
      (offset -inf: it gets no softmax mass and a zero delta) and S alone estimates by HT.
    * Uniform draws (``neg.corr`` empty) or no draws: S \\ C and the fill together are a
      uniform random subset R of the U = n_out - n_c neurons outside C, weighted U / |R|
      (unbiased whenever R is not empty).
    ``enabled`` False: no offsets. (fastmath as the rest of the sample pass: its approximate
    log is part of the pinned numerics.)"""
    lo1 = hi1 = lo2 = hi2 = 0
    log_w1 = log_w2 = 0.0
    kind = CORR_NONE
    if enabled:
        n_out = spec.n_out[spec.n_layers - 1]
        lo1, hi1, lo2, hi2 = n_c, n_s, n_s, n_a
        n_fill = n_a - n_s
        if neg.corr.shape[0] > 0 and neg.n_draws > 0:
            kind = CORR_PLAIN
            if n_fill > 0:
                if n_a - n_c > neg.n_draws:
                    kind = CORR_MIX
                    log_w2 = math.log(max(n_out - n_s, 1) / n_fill) + math.log(0.5)
                else:
                    log_w2 = -math.inf
        elif n_a > n_c:
            log_w1 = math.log(max(n_out - n_c, 1) / (n_a - n_c))
            log_w2 = log_w1
    return OffsetRanges(lo1, hi1, lo2, hi2, log_w1, log_w2), kind


@njit(cache=True, nogil=True, inline="always")
def corr_array(neg, kind):
    """The per-neuron offsets of a ``correction_kind`` (empty for CORR_NONE)."""
    if kind == CORR_PLAIN:
        return neg.corr
    if kind == CORR_MIX:
        return neg.corr_mix
    return neg.corr[:0]


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def correction(spec, n_a, n_c, n_s, neg, enabled):
    """``correction_kind``'s offsets as ``slide.kernels.sample.output_loss`` applies them:
    (ranges, corr), ``corr`` the per-neuron offset array (empty: none)."""
    ranges, kind = correction_kind(spec, n_a, n_c, n_s, neg, enabled)
    return ranges, corr_array(neg, kind)


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def corrected_logit(zk, k, ids, ranges, corr):
    """``zk`` (the logit at active position k, or a value derived from it) plus the offset
    ``correction`` gives position k: the one definition of the corrected logit, used by the
    engine's loss (``slide.kernels.sample.output_loss``) and the shards' forward
    (``slide.distributed.kernels``). ``ids[k]`` (the neuron) is read only when ``corr`` is
    not empty, i.e. for a sampled layer. Inlined: the caller's fastmath flags apply to it,
    as they applied to the copies it replaced (the pinned numerics are unchanged)."""
    lo1, hi1, lo2, hi2, log_w1, log_w2 = ranges
    if lo1 <= k < hi1:
        zk += log_w1
        if corr.shape[0] > 0:
            zk += corr[ids[k]]
    elif lo2 <= k < hi2:
        zk += log_w2
    return zk


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def corrected_max(z, n, ids, ranges, corr):
    """The largest corrected logit of z[:n] (-inf for n = 0): the shift of a log-sum-exp."""
    zmax = -np.inf
    for k in range(n):
        zk = corrected_logit(z[k], k, ids, ranges, corr)
        if zk > zmax:
            zmax = zk
    return zmax


def inclusion_weights(p_in):
    """(corr, corr_mix) of neurons drawn with probability ``p_in`` = P(in the shared set):
    -log p_in and log((1 + 1/p_in) / 2), as float32 (see :func:`correction`)."""
    p = np.maximum(np.asarray(p_in, np.float64), 1e-300)
    corr = -np.log(p)
    return corr.astype(np.float32), np.log(0.5 + 0.5 / p).astype(np.float32)


# buckets of the cdf's index (a power of two, so u * CDF_BUCKETS and k / CDF_BUCKETS are exact)
CDF_BUCKETS = 1 << 16
# draws ahead whose lines the draw asks for (``distinct_draws``): after a batch has swept
# the caches each draw's bucket is a miss, and asking eight ahead hides most of them (the
# same ids either way)
DRAW_PREFETCH = 8


def cdf_buckets(cdf):
    """``lo[k]`` = the number of cdf entries <= k / CDF_BUCKETS, for k = 0 .. CDF_BUCKETS
    (int64): a draw u in [k, k + 1) / CDF_BUCKETS lands in ``[lo[k], lo[k + 1]]``."""
    edges = np.arange(CDF_BUCKETS + 1, dtype=np.float64) / CDF_BUCKETS
    return np.searchsorted(cdf, edges, side="right").astype(np.int64)


@njit(cache=True, nogil=True, error_model="numpy")
def distinct_draws(cdf, lo_of, u, last_id, out):
    """The distinct ids ``min(searchsorted(cdf, u, "right"), last_id)`` of the sorted draws
    ``u`` into ``out`` (ascending); returns their number. The same ids as numpy's
    searchsorted, found by a binary search inside u's bucket (``cdf_buckets``) rather than
    over the whole cdf: at 670k labels the cdf is 5 MB, out of cache after a batch, and a
    full search's ~20 dependent loads a draw, each a likely miss, would dominate the draw."""
    n_b = lo_of.shape[0] - 1
    n_u = u.shape[0]
    n = 0
    prev = -1
    start = 0
    for i in range(n_u):
        # each search starts where the previous one ended, so its misses wait on the last
        # draw's: the bucket bounds of a later draw and the cdf line its bucket begins at are
        # asked for ahead (the draws are sorted, so these are the lines the search will read)
        if i + 2 * DRAW_PREFETCH < n_u:
            prefetch_line(lo_of, min(np.int64(u[i + 2 * DRAW_PREFETCH] * n_b), n_b - 1))
        if i + DRAW_PREFETCH < n_u:
            prefetch_line(cdf, lo_of[min(np.int64(u[i + DRAW_PREFETCH] * n_b), n_b - 1)])
        x = u[i]
        k = min(np.int64(x * n_b), n_b - 1)
        lo = max(lo_of[k], start)     # u is sorted: no answer below the previous one
        hi = lo_of[k + 1]
        while lo < hi:
            mid = (lo + hi) >> 1
            if cdf[mid] <= x:
                lo = mid + 1
            else:
                hi = mid
        start = lo
        j = min(lo, last_id)
        if j != prev:
            out[n] = j
            n += 1
            prev = j
    return n


@njit(cache=True, nogil=True)
def sorted_union(a, b, buf):
    """buf[:n] = the sorted union of the sorted distinct ids ``a`` and ``b``; returns it."""
    i = j = n = 0
    while i < a.shape[0] or j < b.shape[0]:
        if j >= b.shape[0] or (i < a.shape[0] and a[i] < b[j]):
            v = a[i]
            i += 1
        elif i >= a.shape[0] or b[j] < a[i]:
            v = b[j]
            j += 1
        else:
            v = a[i]
            i += 1
            j += 1
        buf[n] = v
        n += 1
    return buf[:n]


@njit(cache=True, nogil=True, error_model="numpy")
def inclusion_offsets(tail_q, n_draws, corr, corr_mix):
    """corr[j] = -log P(j drawn at least once in ``n_draws`` draws from ``tail_q``) and
    corr_mix[j] = log((1 + 1/P) / 2), for every label j (``inclusion_weights``' arithmetic,
    element by element). A label's offsets depend on nothing but its q and the number of
    draws, so they are made once per distribution (``SharedNegatives.set_distribution``)
    rather than by each draw for its ids: four transcendental calls an id at scattered places
    of two arrays of the label count, every batch."""
    for j in range(tail_q.shape[0]):
        p = -math.expm1(n_draws * math.log1p(-min(tail_q[j], 1.0 - 1e-12)))
        p = max(p, 1e-300)
        corr[j] = np.float32(-math.log(p))
        corr_mix[j] = np.float32(math.log(0.5 + 0.5 / p))


@njit(cache=True, nogil=True, error_model="numpy")
def finish_draw(tables, u, ids, out):
    """The batch's shared negatives from the sorted uniforms ``u`` of its frequency draws
    (``SharedNegatives.uniforms``): the distinct tail ids (``distinct_draws``) into ``ids``
    and their sorted union with the head into ``out``; returns the union's size (their
    offsets were made with the distribution: ``inclusion_offsets``). One
    kernel, so that the batched engine can run it beside the first layer's listing
    (``slide.network.block``): its loads are cache misses in the cdf, serial."""
    n = distinct_draws(tables.cdf, tables.cdf_lo, u, tables.cdf.shape[0] - 1, ids)
    return sorted_union(ids[:n], tables.head, out).shape[0]


@njit(cache=True, nogil=True, parallel=True, error_model="numpy")
def finish_draws(tables, U, ids, out, n_out):
    """``finish_draw`` of several batches at once, one batch a task over Numba's threads:
    row b of ``U`` holds batch b's sorted uniforms, its ids go to ``out[b, :n_out[b]]``."""
    for b in prange(U.shape[0]):
        n_out[b] = finish_draw(tables, U[b], ids[b], out[b])


def head_size(n_shared, exact_head):
    """The labels of the exact head: ``exact_head`` (a share in [0, 1)) of ``n_shared``."""
    return int(int(n_shared) * float(exact_head))


class SharedNegatives:
    """The batch-shared negatives of a sampled output layer with ``n_out`` neurons.

    ``corr`` (length n_out when ``power`` > 0, else empty) holds -log P(j drawn at least once
    in the ``n_shared - n_head`` draws) and ``corr_mix`` log((1 + 1/P) / 2) for every neuron,
    made with the distribution (``inclusion_offsets``); the kernels read them by neuron id
    (:func:`correction`).

    ``n_head`` > 0 (frequency draws only): the ``n_head`` labels of highest q -- the most
    frequent -- are in every batch's set with probability 1 (``corr`` 0: computed exactly,
    no importance weight), and the other ``n_shared - n_head`` draws come from the remaining
    labels (q renormalised over them). The head holds much of the softmax's mass, and drawn
    it would bring the estimate of the normaliser its largest variance
    (``bench/results/lsh_block_debcontents.md``: the block's exact top logits are 97 % head
    labels)."""

    def __init__(self, n_shared, power, n_out, n_head=0):
        self.n_shared = int(n_shared)
        self.power = float(power)
        self.n_out = int(n_out)
        self.n_head = min(int(n_head), self.n_shared, self.n_out) if self.power > 0 else 0
        self.q = None
        self.cdf = None
        self.cdf_lo = None
        self.head = np.zeros(0, np.int32)
        self.corr = np.zeros(self.n_out if self.power > 0 else 0, np.float32)
        self.corr_mix = np.zeros_like(self.corr)
        self._ahead = None

    def set_label_counts(self, counts):
        """Training-label counts (length n_out) for frequency-proportional negatives."""
        if self.power <= 0 or self.n_shared == 0:
            return
        q = (np.asarray(counts, np.float64) + 1.0) ** self.power
        self.set_distribution(q / q.sum())

    def set_distribution(self, q):
        """The draw's distribution q (length n_out, sums to 1; saved with a model): the head
        (the ``n_head`` largest q, ties by id) and the cumulative q of the rest."""
        self.q = q
        self._ahead = None          # draws made ahead came from the old distribution
        tail = q
        if self.n_head > 0:
            head = np.sort(np.argsort(-q, kind="stable")[:self.n_head]).astype(np.int32)
            self.head = head
            tail = q.copy()
            tail[head] = 0.0
        # without a head, q itself (bit for bit: the recorded fixtures drew from it)
        self.tail_q = tail / tail.sum() if self.n_head > 0 and tail.sum() > 0 else tail
        self.cdf = np.cumsum(self.tail_q)
        self.cdf[-1] = 1.0
        self.cdf_lo = cdf_buckets(self.cdf)
        n_draws = self.n_shared - self.n_head
        if n_draws > 0 and self.corr.shape[0] == self.tail_q.shape[0]:
            inclusion_offsets(self.tail_q, np.int64(n_draws), self.corr, self.corr_mix)
        # the head's inclusion is certain: offset 0, the exact logit
        self.corr[self.head] = 0.0
        self.corr_mix[self.head] = 0.0

    def draw(self, seed, serial):
        """The batch's shared negative output neurons (sorted, deduplicated, int32), from
        (seed, serial); updates ``corr`` at the drawn ids."""
        if self.n_shared == 0:
            return np.zeros(0, np.int32)
        if self.power <= 0:
            g = np.random.default_rng([int(seed), int(serial), SHARED_NEGATIVES_KEY])
            return np.unique(g.integers(0, self.n_out, self.n_shared)).astype(np.int32)
        u = self.uniforms(seed, serial)
        return self.head.copy() if u is None else self.finish(u)

    def finish(self, u):
        """The draw of the sorted uniforms ``u`` (``uniforms``): its ids (``finish_draw``;
        their offsets in ``corr`` / ``corr_mix`` were made with the distribution)."""
        out = np.empty(u.shape[0] + self.head.shape[0], np.int32)
        n = finish_draw(self.tables(), u, np.empty(u.shape[0], np.int32), out)
        return out[:n]

    def draw_ahead(self, seed, serial, n_ahead):
        """``draw(seed, serial)``, the same ids, from draws made ``n_ahead`` batches at a time
        (``finish_draws``: one batch a thread) and kept until asked for: with many threads a
        batch's own draw is a serial step that leaves the other cores idle (``docs/design.md``,
        "Many cores"). A draw depends only on (seed, serial) and the
        distribution, so the batches' results do not change; a new distribution drops the
        kept draws. For frequency draws only (``power`` > 0, ``n_shared`` > 0)."""
        seed, serial = int(seed), int(serial)
        a = self._ahead
        if a is None or a[0] != seed or not 0 <= serial - a[1] < a[2].shape[0]:
            a = self._draw_batches(seed, serial, max(1, int(n_ahead)))
        if a is None:
            return self.draw(seed, serial)
        b = serial - a[1]
        return a[2][b, :a[3][b]]

    def _draw_batches(self, seed, first, n):
        """Draw batches first .. first + n - 1 into ``self._ahead`` = (seed, first, ids [n, cap],
        counts [n]); None when there is nothing to draw (the head is everything)."""
        u0 = self.uniforms(seed, first)
        if u0 is None:
            return None
        U = np.empty((n, u0.shape[0]), np.float64)
        U[0] = u0
        for b in range(1, n):
            U[b] = self.uniforms(seed, first + b)
        out = np.empty((n, U.shape[1] + self.head.shape[0]), np.int32)
        counts = np.zeros(n, np.int64)
        finish_draws(self.tables(), U, np.empty((n, U.shape[1]), np.int32), out, counts)
        self._ahead = (seed, first, out, counts)
        return self._ahead

    def uniforms(self, seed, serial):
        """The sorted uniforms of batch ``serial``'s frequency draws (``finish_draw`` turns
        them into the ids), or None when there are none to draw (the head is everything).
        For frequency draws only (``power`` > 0, ``n_shared`` > 0)."""
        if self.cdf is None:
            self.set_label_counts(np.zeros(self.n_out))
        n_draws = self.n_shared - self.n_head
        if n_draws == 0 or self.head.shape[0] == self.n_out:
            return None
        g = np.random.default_rng([int(seed), int(serial), SHARED_NEGATIVES_KEY])
        # the draws in sorted order: the cdf is walked once instead of jumped about in, and
        # the distinct ids fall out without a sort
        return np.sort(g.random(n_draws))

    def tables(self):
        """The draw's arrays as ``finish_draw`` takes them (``DrawTables``)."""
        return DrawTables(self.cdf, self.cdf_lo, self.head)

    def bundle(self, ids):
        """The kernels' view of the draw ``ids`` (the latest one): a ``SharedDraw``."""
        return SharedDraw(ids, self.corr, self.corr_mix, self.n_shared)
