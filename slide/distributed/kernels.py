"""Kernels of the label-sharded network: the driver's hidden layer (forward of a batch,
backward of dL/dh into its gradient buffers) and a shard's output layer (active logits and
partial softmax statistics, then deltas and dL/dh from the global normaliser).

A shard's output layer lives in a two-layer ``slide.network.Network`` of sizes
(1, hidden, n_local): its layer 1 is the shard's rows, so the engine's active-set selection
(``select_active``), sampling correction, scratch, row-path optimizer step and LSH
maintenance apply to it unchanged; layer 0 is a 1 x hidden placeholder that is never used.
"""
import math

import numpy as np
from numba import njit, prange

from slide.kernels.layers import (FASTMATH, first_backward, first_forward_dense,
                                  rows_backward, rows_forward)
from slide.kernels.negatives import corrected_logit, correction, is_label
from slide.kernels.normal import normal_pair
from slide.kernels.rng import STREAM_SAMPLE, STREAM_SERIAL_STRIDE, stream_seed
from slide.kernels.sample import select_active


OUT = 1       # the output layer's index in a shard's (1, hidden, n_local) network


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


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True)
def hidden_backward_batch(GW, GB, n_hidden, X, rows, H, dH, n_chunks):
    """Add the gradient of the hidden layer (dH = dL/dh, masked here by the ReLU) into GW/GB,
    HOGWILD over samples as the single-process batch kernel does. dH is overwritten."""
    nb = rows.shape[0]
    for c in prange(n_chunks):
        for s in range((c * nb) // n_chunks, ((c + 1) * nb) // n_chunks):
            r = rows[s]
            d = dH[s]
            h = H[s]
            for i in range(n_hidden):
                if h[i] <= 0.0:
                    d[i] = 0.0
            first_backward(GW, GB, 0, 0, n_hidden, X.ind[X.ptr[r]:X.ptr[r + 1]],
                           X.dat[X.ptr[r]:X.ptr[r + 1]], True, rows[:0], 0, d)


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
# shard: training
# ----------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def _shard_sample_forward(params, spec, tables, sc, c, ids, n_act, h, labels, neg, rng, stamp,
                          correct, z):
    """Active set, corrected logits z[:n] (offset -inf: left out of the estimate) of one
    sample; returns (n, max, sum of exp(z - max), sum of label logits, labels found)."""
    n_in = spec.n_in[OUT]
    out = ids[sc.s_off[OUT]:sc.s_off[OUT + 1]]
    cnt, rng, n_c, n_s = select_active(OUT, spec, tables, sc, c, False, out, h, n_in, labels,
                                       neg.ids, rng, stamp, out, True)
    n_act[OUT] = cnt
    z32 = sc.acts[c, sc.a_off[OUT]:sc.a_off[OUT + 1]]
    rows_forward(params.W, params.B, spec.w_off[OUT], spec.b_off[OUT], n_in, True, out, h,
                 n_in, False, out, cnt, False, z32)
    ranges, corr = correction(spec, cnt, n_c, n_s, neg, correct)
    zmax = -np.inf
    lz = 0.0
    n_found = 0
    for k in range(cnt):
        zk = corrected_logit(np.float64(z32[k]), k, out, ranges, corr)
        z[k] = zk
        if zk > zmax:
            zmax = zk
        if is_label(labels, out[k]):
            lz += zk
            n_found += 1
    ssum = 0.0
    if np.isfinite(zmax):
        for k in range(cnt):
            ssum += math.exp(z[k] - zmax)
    return cnt, zmax, ssum, lz, n_found


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True, error_model="numpy")
def shard_forward_kernel(params, spec, tables, sc, zbuf, H, lab_ptr, lab_ind, seed, serial,
                         neg, correct, stats):
    """Forward of a shard's output layer for a batch: per sample the active set (the shard's
    local labels forced, its shared negatives, its fill), the corrected active logits (kept
    in ``zbuf`` [batch, capacity] float64 for the backward pass) and stats[:, s] = (max,
    sum of exp(z - max), sum of the label logits, number of labels found, active outputs).
    Random draws: the single-process engine's streams (seed, serial, sample position)."""
    nb = H.shape[0]
    n_chunks = sc.acts.shape[0]
    for c in prange(n_chunks):
        for s in range((c * nb) // n_chunks, ((c + 1) * nb) // n_chunks):
            rng = stream_seed(seed, STREAM_SAMPLE + serial * STREAM_SERIAL_STRIDE, s)
            cnt, mx, ssum, lz, nf = _shard_sample_forward(
                params, spec, tables, sc, c, sc.ids[s], sc.n_act[s], H[s],
                lab_ind[lab_ptr[s]:lab_ptr[s + 1]], neg, rng, serial * 1048576 + s + 1,
                correct, zbuf[s])
            stats[0, s] = mx
            stats[1, s] = ssum
            stats[2, s] = lz
            stats[3, s] = nf
            stats[4, s] = cnt


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True, error_model="numpy")
def shard_backward_kernel(params, spec, sc, store, zbuf, H, lab_ptr, lab_ind, log_z, n_labels,
                          scale, dH):
    """Deltas of the shard's active outputs from the global log normaliser ``log_z`` (per
    sample) and the sample's GLOBAL label count: delta = scale * (exp(z - log Z) - 1/|y| on
    a label), stored in place of the logits for the row-path optimizer step; h_store = H;
    dH[s] = W[active]^T delta (this shard's share of dL/dh, before the ReLU mask)."""
    nb = H.shape[0]
    n_in = spec.n_in[OUT]
    n_chunks = sc.acts.shape[0]
    s0 = sc.s_off[OUT]
    h_store, d_store = store.h_store, store.d_store     # out of the bundle before the prange
    ids_all, n_act = sc.ids, sc.n_act
    for c in prange(n_chunks):
        for s in range((c * nb) // n_chunks, ((c + 1) * nb) // n_chunks):
            cnt = n_act[s, OUT]
            ids = ids_all[s, s0:s0 + cnt]
            labels = lab_ind[lab_ptr[s]:lab_ptr[s + 1]]
            d = d_store[s]
            z = zbuf[s]
            ny = n_labels[s]
            w = 1.0 / ny if ny > 0 else 0.0
            lzs = log_z[s]
            for k in range(cnt):
                v = 0.0
                if ny > 0:
                    v = math.exp(z[k] - lzs)
                    if is_label(labels, ids[k]):
                        v -= w
                d[k] = v * scale
            for i in range(n_in):
                h_store[s, i] = H[s, i]
            rows_backward(params.W, params.GW, params.GB, spec, OUT, True, ids, H[s], n_in, False,
                          ids, cnt, d, dH[s], False)
