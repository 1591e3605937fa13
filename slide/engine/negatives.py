"""Shared negatives of a batch, their importance weights, and the sampling correction.

Every sample of a batch gets the same ``n_shared`` negative output neurons forced into its
active set, drawn uniformly or (``negative_power`` > 0) with probability
q_j ~ (count_j + 1)^power, so the frequent labels -- which hold most of the softmax's mass --
are almost always present. The softmax over a sample's active set then estimates the full one
by offsetting the logits of the neurons that stand for the rest (the logQ correction of TF's
sampled softmax), see :func:`correction`.
"""
import math

import numpy as np
from numba import njit

from slide._rng import SHARED_NEGATIVES_KEY
from slide.engine.arrays import CFG_SAMPLER, SAMPLER_RANDOM
from slide.layers import FASTMATH


@njit(cache=True, nogil=True, inline="always")
def is_label(labels, j):
    """Binary search of ``j`` in the sorted label ids of one sample."""
    lo = 0
    hi = labels.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        v = labels[mid]
        if v < j:
            lo = mid + 1
        elif v > j:
            hi = mid
        else:
            return True
    return False


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def correction(spec, n_a, labels, shared, shared_corr, n1, enabled):
    """Logit offsets of one sample's sampled softmax: ((lo1, hi1, lo2, hi2, log_w1, log_w2),
    corr), as ``slide.engine.sample.output_loss`` applies them.

    The output active set is: the true labels [0, ny), the shared negatives that are not labels
    [ny, n_fk), LSH candidates [n_fk, n1), uniform random fill [n1, n_a). The random negatives
    R' (shared and fill) stand for all U = C - |S| neurons not computed exactly, so their
    logits get + log(U / |R'|); the normaliser then estimates the full softmax's, and the label
    gradient p - 1/|y| is that of the dense network. Frequency-weighted shared negatives
    (``shared_corr`` non-empty, indexed by neuron) carry their own weight -log P(j drawn); a
    uniform fill estimates the same remainder, so with both present each counts half.
    ``enabled`` False: no offsets. (fastmath as the rest of the sample pass: its approximate
    log is part of the pinned numerics.)"""
    lo1 = hi1 = lo2 = hi2 = 0
    log_w = 0.0
    weighted = shared_corr.shape[0] > 0
    last = spec.n_layers - 1
    if enabled:
        ny = labels.shape[0]
        if spec.cfg[CFG_SAMPLER] == SAMPLER_RANDOM:
            lo1 = ny
            hi1 = n_a
            if weighted:
                # shared negatives first, then the uniform fill
                lo2 = n1
                hi2 = n_a
                hi1 = n1
        else:
            n_fk = ny
            for i in range(shared.shape[0]):
                if not is_label(labels, shared[i]):
                    n_fk += 1
            lo1 = ny
            hi1 = n_fk
            lo2 = n1
            hi2 = n_a
        n_rand = (hi1 - lo1) + (hi2 - lo2)
        if weighted:
            n_fill = hi2 - lo2
            if n_fill > 0:
                u = spec.n_out[last] - (n_a - n_fill)
                log_w = math.log(max(u, 1) / n_fill)
        elif n_rand > 0:
            u = spec.n_out[last] - (n_a - n_rand)
            log_w = math.log(max(u, 1) / n_rand)
    log_w1 = log_w2 = log_w
    corr = shared_corr[:0]
    if weighted and hi1 > lo1:
        corr = shared_corr
        log_w1 = 0.0
        if hi2 > lo2:
            log_w1 = math.log(0.5)
            log_w2 = log_w + math.log(0.5)
    return (lo1, hi1, lo2, hi2, log_w1, log_w2), corr


class SharedNegatives:
    """The batch-shared negatives of a sampled output layer with ``n_out`` neurons.

    ``corr`` (length n_out when ``power`` > 0, else empty) holds -log P(j drawn at least once
    in ``n_shared`` draws) for the ids of the latest draw: the kernels read it by neuron id."""

    def __init__(self, n_shared, power, n_out):
        self.n_shared = int(n_shared)
        self.power = float(power)
        self.n_out = int(n_out)
        self.q = None
        self.cdf = None
        self.corr = np.zeros(self.n_out if self.power > 0 else 0, np.float32)

    def set_label_counts(self, counts):
        """Training-label counts (length n_out) for frequency-proportional negatives."""
        if self.power <= 0 or self.n_shared == 0:
            return
        q = (np.asarray(counts, np.float64) + 1.0) ** self.power
        q /= q.sum()
        self.q = q
        self.cdf = np.cumsum(q)
        self.cdf[-1] = 1.0

    def draw(self, seed, serial):
        """The batch's shared negative output neurons (sorted, deduplicated, int32), from
        (seed, serial); updates ``corr`` at the drawn ids."""
        if self.n_shared == 0:
            return np.zeros(0, np.int32)
        g = np.random.default_rng([int(seed), int(serial), SHARED_NEGATIVES_KEY])
        n_o = self.n_out
        if self.power <= 0:
            return np.unique(g.integers(0, n_o, self.n_shared)).astype(np.int32)
        if self.cdf is None:
            self.set_label_counts(np.zeros(n_o))
        draws = np.searchsorted(self.cdf, g.random(self.n_shared), side="right")
        ids = np.unique(np.minimum(draws, n_o - 1)).astype(np.int32)
        q = self.q[ids]
        p_in = -np.expm1(self.n_shared * np.log1p(-np.minimum(q, 1.0 - 1e-12)))
        self.corr[ids] = -np.log(np.maximum(p_in, 1e-300))
        return ids
