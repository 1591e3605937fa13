"""The ``softmax_each`` loss: one softmax per true label, over that label and the sample's
active non-labels, averaged over its labels.

The ``softmax`` loss (the SLIDE paper's and TensorFlow's sampled softmax) fits the target
distribution 1/|y| over a sample's labels: they share one unit of probability, so a row with
dozens of labels (debcontents: 36 on average) pulls every label it already ranks high back
down towards 1/|y|, in favour of its other labels. Here each label competes with the
non-labels only: label p's term is -log(e^z_p / (e^z_p + sum over the active non-labels n of
e^z_n)), the non-labels' logits carrying the same sampling correction as in ``softmax`` (their
corrected sum estimates the sum over every non-label). Measured: the network's own P@1 2.7
and 4.1 points higher on debdeps and debcontents, 3.8 on xc200k, for 1-8 % more time; the whole
``SlideClassifier()`` level (``bench/results/losses_{network,pipeline}_*_7b78566.md``).

With the non-labels' largest logit M, N = sum_n e^(z_n - M) (>= 1) and x_p = z_p - M - log N:
label p adds softplus(-x_p) to the loss and gets the delta sigmoid(x_p) - 1; non-label n gets
e^(z_n - M) / N * sum_p (1 - sigmoid(x_p)); all divided by |y| (and times the batch's scale).
``each_loss`` is the per-sample path's (over an active set, ``slide.kernels.sample
.output_loss``), ``each_row`` the batched engine's (over a row of S and its extras,
``slide.network.block.block_loss``).
"""
import math

import numpy as np

from slide.kernels.expsum import exp_shifted_inplace, max_and_finite, max_or_nan
from slide.kernels.jit import njit
from slide.kernels.layers import FASTMATH
from slide.kernels.negatives import corrected_logit, is_label, seek_sorted

# the output losses' codes (``slide.network.network.LOSSES``)
LOSS_SOFTMAX, LOSS_SIGMOID, LOSS_SOFTMAX_EACH = 0, 1, 2
# the kernels' ``each`` argument: this array for softmax_each, None otherwise. The choice is a
# type, not a value, so Numba prunes the branch that calls this module's kernels from the
# default network's code: it compiles them only for a softmax_each network (cold, they cost
# the quickstart's compilation ~6 s as a runtime branch)
EACH = np.zeros(1, np.uint8)


def loss_marker(loss_code):
    """The kernels' ``each`` argument of a network with this loss code."""
    return EACH if loss_code == LOSS_SOFTMAX_EACH else None


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def each_terms(x):
    """(loss, sigma) of one true label in ``softmax_each``: x = its logit minus the log-sum-exp
    of the non-labels; loss = -log sigmoid(x) = softplus(-x), computed without overflow."""
    if x >= 0.0:
        e = math.exp(-x)
        return math.log1p(e), 1.0 / (1.0 + e)
    e = math.exp(x)
    return math.log1p(e) - x, e / (1.0 + e)


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def each_loss(z, n_act, dense, ids, labels, scale, delta, corr_ranges, corr):
    """``softmax_each`` over one sample's active logits z[:n_act] (the module's formulas):
    writes scale * dLoss/dz to delta, returns the loss. Labels never join the non-labels'
    sum, which is why the shift is the non-labels' maximum, not the row's."""
    ny = labels.shape[0]
    zmax = -np.inf
    finite = True
    if ny > 0:
        for k in range(n_act):
            j = k if dense else ids[k]
            zk = corrected_logit(z[k], k, ids, corr_ranges, corr)
            finite &= zk == zk and zk != np.inf       # -inf: a dropped fill
            if zk > zmax and not is_label(labels, j):
                zmax = zk
    if ny == 0 or not finite or zmax == -np.inf:
        # no labels, or no active non-label to tell them from: nothing to learn; overflowed
        # logits (a diverging run): NaN, and the engine stops before updating
        for k in range(n_act):
            delta[k] = 0.0
        return 0.0 if finite else np.nan
    # one pass reads z (delta may alias z: the dense path computes in place); a label's
    # delta holds its corrected logit until the next pass
    nsum = 0.0
    for k in range(n_act):
        j = k if dense else ids[k]
        zk = corrected_logit(z[k], k, ids, corr_ranges, corr)
        if is_label(labels, j):
            delta[k] = zk
        else:
            e = math.exp(zk - zmax)
            delta[k] = e
            nsum += e
    shift = zmax + math.log(nsum)
    loss = 0.0
    rest = 0.0
    w = scale / ny
    for k in range(n_act):
        j = k if dense else ids[k]
        if is_label(labels, j):
            lp, sig = each_terms(delta[k] - shift)
            loss += lp
            rest += 1.0 - sig
            delta[k] = w * (sig - 1.0)
    f = w * rest / nsum
    for k in range(n_act):
        j = k if dense else ids[k]
        if not is_label(labels, j):
            delta[k] *= f
    return loss / ny


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def each_row(zs, off, bS, log_w1, col, out, n_c, dx, labels, scale, saved):
    """``softmax_each`` of one sample whose active set holds all of S, the batched engine's
    form of ``each_loss`` (arguments as ``slide.network.block._softmax_row``): ``zs`` (its row
    of H W_S^T) and ``dx`` (its extras' corrected logits) become its deltas; returns the loss.
    The labels (all in C, exact logits kept in ``saved``) leave the exp pass at -inf (the
    vectorised exp floors them at e^-87, ~1e-38 against a sum >= 1)."""
    ny = labels.shape[0]
    if ny == 0 or not _exact_logits(zs, off, bS, log_w1, col, n_c, dx, saved):
        # no labels; or overflowed logits (a diverging run): NaN, the engine stops
        zs[:] = 0.0
        dx[:] = 0.0
        return 0.0 if ny == 0 else np.nan
    _drop_labels(zs, col, out, n_c, dx, labels)
    zmax = max(max_or_nan(zs)[0], max_or_nan(dx)[0])
    if zmax == -np.inf:
        # no active non-label to tell the labels from
        zs[:] = 0.0
        dx[:] = 0.0
        return 0.0
    nsum = exp_shifted_inplace(zs, zmax)
    for i in range(dx.shape[0]):
        v = math.exp(np.float64(dx[i]) - zmax)      # a label or a dropped fill (-inf) gets 0
        dx[i] = v
        nsum += v
    shift = zmax + math.log(nsum)
    w = scale / ny
    loss = 0.0
    rest = 0.0
    cur = 0
    for k in range(n_c):
        p, cur = seek_sorted(labels, out[k], cur)
        if p >= 0:
            lp, sig = each_terms(saved[k] - shift)
            loss += lp
            rest += 1.0 - sig
    f = np.float32(w * rest / nsum)
    for c in range(zs.shape[0]):
        zs[c] *= f
    for i in range(dx.shape[0]):
        dx[i] *= f
    e = 0
    cur = 0
    for k in range(n_c):
        c = col[k]
        p, cur = seek_sorted(labels, out[k], cur)
        if p >= 0:
            d = np.float32(w * (each_terms(saved[k] - shift)[1] - 1.0))
            if c >= 0:
                zs[c] = d
            else:
                dx[e] = d
        if c < 0:
            e += 1
    return loss / ny


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def offset_row(zs, off, bS, log_w1, col, n_c, saved):
    """A batched row's logits before its loss: S's columns get ``off`` (bias + the column's
    offset) and ``log_w1``; the exact logits (logit + bias) of C's entries in S are kept in
    ``saved[k]`` for the caller to put back (both softmax losses' row passes)."""
    for k in range(n_c):
        c = col[k]
        if c >= 0:
            saved[k] = zs[c] + bS[c]
    w1 = np.float32(log_w1)
    for c in range(zs.shape[0]):
        zs[c] += off[c] + w1


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def _exact_logits(zs, off, bS, log_w1, col, n_c, dx, saved):
    """``offset_row``, then C's entries back at their exact logit (also in ``saved[k]``, the
    extras' too); returns whether every logit is finite."""
    offset_row(zs, off, bS, log_w1, col, n_c, saved)
    e = 0
    for k in range(n_c):
        c = col[k]
        if c >= 0:
            zs[c] = saved[k]
        else:
            saved[k] = dx[e]
            e += 1
    _, finite = max_and_finite(zs)
    xmax, xbad = max_or_nan(dx)
    return finite and not xbad and xmax != np.inf


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _drop_labels(zs, col, out, n_c, dx, labels):
    """Set the labels' entries of ``zs`` / ``dx`` to -inf (out of the non-labels' sum)."""
    e = 0
    cur = 0
    for k in range(n_c):
        c = col[k]
        p, cur = seek_sorted(labels, out[k], cur)
        if p >= 0:
            if c >= 0:
                zs[c] = -np.inf
            else:
                dx[e] = -np.inf
        if c < 0:
            e += 1
