"""Kernels of the label-sharded network: the driver's hidden layer (forward of a batch,
backward of dL/dh into its gradient buffers) and a shard's output layer (active logits and
partial softmax statistics, then deltas and dL/dh from the global normaliser).

A shard's output layer lives in a two-layer ``slide.network.Network`` of sizes
(1, hidden, n_local): its layer 1 is the shard's rows, so the engine's active-set selection
(``select_active``), sampling correction, scratch, row-path optimizer step and LSH
maintenance apply to it unchanged; layer 0 is a 1 x hidden placeholder that is never used.
A shard trains as the batched engine does (``slide.network.block``): the rows of its shared
negatives S every sample holds are three BLAS products for the batch (Z = H W_S^T,
dH = D W_S, dW_S = D^T H, in ``slide.distributed.shard``), and only what differs between
samples -- its labels outside S, its random fill ("extras") -- goes through per-sample loops.
"""
import math
from typing import NamedTuple

import numpy as np
from numba import prange

from slide.kernels.jit import njit
from slide.kernels.layers import FASTMATH, first_forward_dense
from slide.kernels.expsum import exp_shifted_inplace, max_and_finite, max_or_nan
from slide.kernels.negatives import correction_kind, find_sorted, is_label
from slide.kernels.normal import normal_pair
from slide.kernels.rng import STREAM_SAMPLE, STREAM_SERIAL_STRIDE, stream_seed
from slide.kernels.sample import mark_stamp, select_active
from slide.network.extras import add_delta_rows, row_logit


OUT = 1       # the output layer's index in a shard's (1, hidden, n_local) network


class ShardForward(NamedTuple):
    """A batch's forward pass on a shard, kept until its backward pass."""
    H: np.ndarray            # [batch, hidden] float32: the driver's hidden activations
    WS: np.ndarray           # [|S|, hidden] float32: the rows of S as the forward pass read them
    Z: np.ndarray            # [batch, |S|] float32: H W_S^T, then exp(z - max) a sample
    extra: np.ndarray        # [batch, capacity] int32: each sample's active ids outside S
    n_extra: np.ndarray      # [batch, 1] int64: their number
    dx: np.ndarray           # [batch, capacity] float32: exp(z - max) of the extras
    # [batch, capacity] int32: each found label's column in S, or -(1 + its place among the
    # extras)
    slots: np.ndarray
    stats: np.ndarray        # [5, batch] float64: the partial statistics (module docstring)


class ShardScratch(NamedTuple):
    """A shard's per-thread scratch of the forward pass."""
    cols: np.ndarray         # [chunks, capacity] int64: C's columns in S (-1: an extra)
    saved: np.ndarray        # [chunks, capacity] float32: C's exact logits in S


# ----------------------------------------------------------------------------------------------
# driver: the hidden layer
# ----------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True)
def hidden_forward_batch(W, B, n_hidden, X, rows, out):
    """out[s] = relu(b0 + sum_j x_j W0T[j]) for each row ``rows[s]`` of the CSR ``X``."""
    for s in prange(rows.shape[0]):
        r = rows[s]
        first_forward_dense(W, B, 0, 0, n_hidden, X.ind[X.ptr[r]:X.ptr[r + 1]],
                            X.dat[X.ptr[r]:X.ptr[r + 1]], out[s])


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def hidden_deltas(H, dH, GB):
    """dH (dL/dh, the shards' sum) masked by the ReLU in place: the hidden layer's deltas;
    their sum over the batch is added into the bias gradient GB. (The weights' step forms
    their gradient from the deltas: ``row_steps.first_layer_step``.)"""
    for s in range(dH.shape[0]):
        d = dH[s]
        h = H[s]
        for i in range(d.shape[0]):
            if h[i] <= 0.0:
                d[i] = 0.0
            GB[i] += d[i]


@njit(cache=True, nogil=True)
def split_labels(Y, rows, bounds, ptr, ind, n_labels):
    """The batch ``rows``' labels (``Y``, a ``Csr`` with sorted ids) by shard: shard q's as
    local ids (global - bounds[q]) in ind[ptr[q, s]:ptr[q, s + 1]] for sample s (ptr
    [shards, batch + 1], ind room for the batch's labels per shard); n_labels[s] = the
    sample's global label count."""
    n_sh = bounds.shape[0] - 1
    nb = rows.shape[0]
    for q in range(n_sh):
        lo, hi = bounds[q], bounds[q + 1]
        n = 0
        ptr[q, 0] = 0
        for s in range(nb):
            r = rows[s]
            for p in range(Y.ptr[r], Y.ptr[r + 1]):
                j = Y.ind[p]
                if lo <= j < hi:
                    ind[q, n] = j - lo
                    n += 1
            ptr[q, s + 1] = n
    for s in range(nb):
        n_labels[s] = Y.ptr[rows[s] + 1] - Y.ptr[rows[s]]


@njit(cache=True, nogil=True)
def combine_partials(m, s):
    """Global log normaliser per sample from the shards' partial statistics: m[q, i] (max of
    shard q's corrected active logits) and s[q, i] (sum of exp(z - m) over them):
    log Z_i = M + log(sum_q s[q, i] exp(m[q, i] - M)), M = max_q m[q, i]."""
    n_sh, n = m.shape
    out = np.empty(n, np.float64)
    for i in range(n):
        mx = -np.inf
        for q in range(n_sh):
            if s[q, i] > 0.0 and m[q, i] > mx:
                mx = m[q, i]
        tot = 0.0
        for q in range(n_sh):
            if s[q, i] > 0.0:
                tot += s[q, i] * math.exp(m[q, i] - mx)
        out[i] = mx + math.log(tot) if tot > 0.0 else np.nan
    return out


# ----------------------------------------------------------------------------------------------
# shard: initialisation
# ----------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def init_rows_like_global(out, g_start, g_lo, std, seed, stream):
    """out[i] = the Glorot-normal draw ``slide.kernels.layers.init_params`` gives flat index
    g_lo + i of a layer starting at flat index ``g_start`` (Box-Muller pairs start at even
    offsets from g_start): a shard's rows get exactly the single-process initial weights."""
    n = out.shape[0]
    first = g_start + ((g_lo - g_start) // 2) * 2
    for p in range(first, g_lo + n, 2):
        c, s = normal_pair(seed, stream, p, std)
        if g_lo <= p < g_lo + n:
            out[p - g_lo] = c
        if g_lo <= p + 1 < g_lo + n:
            out[p + 1 - g_lo] = s


# ----------------------------------------------------------------------------------------------
# shard: training (the batched engine's split: the products by BLAS, the rest per sample)
# ----------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def _shard_sample_forward(params, spec, tables, sc, c, fw, s, labels, neg, offs, rng, stamp,
                          correct, scratch):
    """Sample s of the batch ``fw``: its active set (``select_active``: [C | S minus C |
    fill]); its corrected logits, S's in its row of Z = H W_S^T, the others' (its "extras":
    ids of C outside S, the fill; scored by dot products) in fw.dx[s] with their ids in
    fw.extra[s]; both then replaced by exp(z - max). Returns (max, sum of exp(z - max), sum
    of the label logits, labels found, active count, extras); each found label's place in
    fw.slots[s] (its column, or -(1 + its place among the extras)). A logit that is not
    finite gives the sum NaN (the driver then stops before any update). ``scratch``: the
    thread's ``ShardScratch``."""
    h, zs, extra, dx, slots = fw.H[s], fw.Z[s], fw.extra[s], fw.dx[s], fw.slots[s]
    cols, saved = scratch.cols[c], scratch.saved[c]
    n_in = spec.n_in[OUT]
    out = sc.ids[c, sc.s_off[OUT]:sc.s_off[OUT + 1]]
    shared = neg.ids
    ns = shared.shape[0]
    cnt, rng, n_c, n_s = select_active(OUT, spec, tables, sc, c, False, out, h, n_in, labels,
                                       shared, rng, stamp, out, False)
    ranges, kind = correction_kind(spec, cnt, n_c, n_s, neg, correct)
    log_w1, log_w2 = ranges.log_w1, ranges.log_w2
    W, B = params.W, params.B
    w_off, b_off = spec.w_off[OUT], spec.b_off[OUT]
    lz = 0.0
    n_found = 0
    n_x = 0
    for k in range(n_c):
        j = out[k]
        q = find_sorted(shared, j)
        cols[k] = q
        if q >= 0:
            v = zs[q] + B[b_off + j]
            saved[k] = v
        else:
            v = row_logit(W, B, w_off, b_off, j, h)
            extra[n_x] = j
            dx[n_x] = v
            n_x += 1
        if is_label(labels, j):
            lz += v
            slots[n_found] = q if q >= 0 else -n_x
            n_found += 1
    # every column of S is active: a sample's capacity holds its labels, its LSH budget and
    # all of S (``arrays.capacity``), so ``select_active`` never cuts S short; S minus C then
    # takes S's offsets and C's columns their exact logits back
    off = offs[kind]
    w1 = np.float32(log_w1)
    for q in range(ns):
        zs[q] += off[q] + w1
    for k in range(n_c):
        if cols[k] >= 0:
            zs[cols[k]] = saved[k]
    for k in range(n_s, cnt):             # the fill: [lo2, hi2)
        j = out[k]
        extra[n_x] = j
        dx[n_x] = np.float32(np.float64(row_logit(W, B, w_off, b_off, j, h)) + log_w2)
        n_x += 1
    zmax, finite = max_and_finite(zs)
    xmax, xbad = max_or_nan(dx[:n_x])
    zmax = max(zmax, xmax)
    if not finite or xbad or not math.isfinite(zmax):
        # an overflowed logit (a diverging run): the driver stops before any update
        return zmax, np.nan, lz, n_found, cnt, n_x
    ssum = exp_shifted_inplace(zs, zmax)          # vectorised
    for e in range(n_x):
        v = math.exp(np.float64(dx[e]) - zmax)        # a dropped fill (-inf) gets 0
        dx[e] = v
        ssum += v
    return zmax, ssum, lz, n_found, cnt, n_x


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True, error_model="numpy")
def shard_forward_kernel(params, spec, tables, sc, fw, labels, seed, serial, neg, offs,
                         correct, scratch):
    """Forward of a shard's output layer for a batch ``fw`` (a ``ShardForward`` whose Z is
    H W_S^T; ``labels``: the batch's local labels, a ``Csr`` over its samples): per sample
    the active set (the shard's local labels forced, its shared negatives S, its fill) and
    ``_shard_sample_forward``'s exp(z - max) in Z and fw.dx; fw.stats[:, s] = (max, sum of
    exp(z - max), sum of the label logits, number of labels found, active outputs).
    ``offs``: ``block.block_offsets`` of S; ``scratch``: a ``ShardScratch``.
    Random draws: the single-process engine's streams (seed, serial, sample position)."""
    n_extra, stats = fw.n_extra, fw.stats
    lab_ptr, lab_ind = labels.ptr, labels.ind
    nb = fw.H.shape[0]
    n_chunks = sc.acts.shape[0]
    for c in prange(n_chunks):
        for s in range((c * nb) // n_chunks, ((c + 1) * nb) // n_chunks):
            rng = stream_seed(seed, STREAM_SAMPLE + serial * STREAM_SERIAL_STRIDE, s)
            # int64(c): a prange index is typed unsigned inside the parallel loop, signed
            # outside it; one type compiles the callee once
            mx, ssum, lz, nf, cnt, n_x = _shard_sample_forward(
                params, spec, tables, sc, np.int64(c), fw, s,
                lab_ind[lab_ptr[s]:lab_ptr[s + 1]], neg, offs, rng, mark_stamp(serial, s),
                correct, scratch)
            stats[0, s] = mx
            stats[1, s] = ssum
            stats[2, s] = lz
            stats[3, s] = nf
            stats[4, s] = cnt
            n_extra[s, 0] = n_x


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True, error_model="numpy")
def shard_backward_kernel(W, w_off, fw, log_z, n_labels, scale, dH):
    """Deltas of the shard's active outputs from the global log normaliser ``log_z`` (per
    sample) and the sample's GLOBAL label count: delta = scale * (exp(z - log Z) - 1/|y| on
    a label), i.e. the forward pass's exp(z - max) times scale * exp(max - log Z). S's
    replace fw.Z (D: BLAS then forms dH += D W_S and dW_S = D^T H), the extras' fw.dx (the
    row path's deltas); dH[s] = the extras' rows times their deltas (their share of dL/dh,
    before the ReLU mask)."""
    Z, extra, n_extra, dx, slots, stats = fw.Z, fw.extra, fw.n_extra, fw.dx, fw.slots, fw.stats
    nb = Z.shape[0]
    for s in prange(nb):
        ny = n_labels[s]
        zs = Z[s]
        d = dx[s]
        n_x = n_extra[s, 0]
        f = np.float32(scale * math.exp(stats[0, s] - log_z[s])) if ny > 0 else np.float32(0)
        for q in range(zs.shape[0]):
            zs[q] *= f
        for e in range(n_x):
            d[e] *= f
        if ny > 0:
            wl = np.float32(scale / ny)
            for i in range(int(stats[3, s])):
                q = slots[s, i]
                if q >= 0:
                    zs[q] -= wl
                else:
                    d[-1 - q] -= wl
        g = dH[s]
        g[:] = 0.0
        add_delta_rows(W, w_off, extra[s], d, 0, n_x, g)
