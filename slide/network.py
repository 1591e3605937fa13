"""The training engine: one Numba call per batch (HOGWILD over samples), touched-row
bookkeeping, exact and sparse inference, and the rehash schedule.

Per sample, in its thread's scratch (see ``_sample_pass``):

    h0 = relu(b0 + sum_j x_j W0T[j])                 layer 0: only x's nonzero features
    for each later layer: active = all neurons, or LSH sampler(h_in) (+ true labels on the
                          output layer) padded with random neurons to min_active;
                          z = W[active] h_in + b[active]   (only the active rows)
    softmax (or sigmoid) over the active logits; delta = p - y/|y|
    backward by message passing: g[active] += outer(delta, h_in); d_in = W[active]^T delta
    g0T[x.indices] += outer(x.data, d0)

Threads add into the shared gradient buffers without locks (HOGWILD); the optimizer runs once
after the batch on the deduplicated touched rows (``collect_touched`` + ``slide.optim``).
"""
import math

import numpy as np
from numba import njit, prange

from slide._rng import stream_seed, randint
from slide.layers import (FASTMATH, first_forward_dense, first_forward_sparse, first_backward,
                          rows_forward, rows_backward)
from slide.lsh.hashes import hash_dense_into, hash_sparse_into
from slide.lsh.samplers import sample_into
from slide.lsh.index import build_tables_into

LOSSES = {"softmax": 0, "sigmoid": 1}

# Streams of the counter RNG (slide._rng): what a draw is for.
STREAM_SAMPLE = 7          # per (batch serial, sample position): sampler / random fill
STREAM_PREDICT = 11        # per (call, sample): random fill at sparse inference


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True, inline="always")
def _is_label(labels, j):
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
def _output_loss(z, n_act, dense, ids, labels, loss_code, scale, delta, lo1, hi1, lo2, hi2,
                 log_w1, log_w2, corr):
    """Loss of one sample over its active logits z[:n_act]; writes scale * dLoss/dz to delta.

    softmax: cross-entropy against the target distribution 1/|y| on each true label (the SLIDE
    paper / TF baseline); sigmoid: binary cross-entropy summed over the active outputs.
    """
    ny = labels.shape[0]
    if loss_code == 0:
        if ny == 0:
            # no target distribution: the sample contributes nothing
            for k in range(n_act):
                delta[k] = 0.0
            return 0.0
        # logits at positions [lo1, hi1) are offset by log_w1 (+ corr[neuron] when ``corr`` is
        # not empty), those at [lo2, hi2) by log_w2 (softmax only)
        use_corr = corr.shape[0] > 0
        zmax = -np.inf
        for k in range(n_act):
            zk = z[k]
            if lo1 <= k < hi1:
                zk += log_w1
                if use_corr:
                    zk += corr[ids[k]]
            elif lo2 <= k < hi2:
                zk += log_w2
            if zk > zmax:
                zmax = zk
        if not np.isfinite(zmax):
            # overflowed logits (a diverging run): report NaN, the engine stops before updating
            for k in range(n_act):
                delta[k] = 0.0
            return np.nan
        # one pass reads z (delta may alias z: the dense path computes in place)
        ssum = 0.0
        lz = 0.0
        n_found = 0
        for k in range(n_act):
            j = k if dense else ids[k]
            zk = z[k] - zmax
            if lo1 <= k < hi1:
                zk += log_w1
                if use_corr:
                    zk += corr[ids[k]]
            elif lo2 <= k < hi2:
                zk += log_w2
            if _is_label(labels, j):
                lz += zk
                n_found += 1
            e = math.exp(zk)
            delta[k] = e
            ssum += e
        inv = 1.0 / ssum
        logs = math.log(ssum)
        w = 1.0 / ny
        loss = -w * lz + w * n_found * logs
        for k in range(n_act):
            j = k if dense else ids[k]
            d = delta[k] * inv
            if _is_label(labels, j):
                d -= w
            delta[k] = d * scale
        return loss
    else:
        loss = 0.0
        for k in range(n_act):
            j = k if dense else ids[k]
            zk = z[k]
            y = 1.0 if _is_label(labels, j) else 0.0
            # stable BCE: max(z,0) - z*y + log(1 + exp(-|z|))
            loss += max(zk, 0.0) - zk * y + math.log1p(math.exp(-abs(zk)))
            if zk >= 0:
                p = 1.0 / (1.0 + math.exp(-zk))
            else:
                ez = math.exp(zk)
                p = ez / (1.0 + ez)
            delta[k] = (p - y) * scale
        return loss


@njit(cache=True, nogil=True, inline="always")
def _pad_random(ids, n, target, n_neurons, rng, mark, serial):
    """Append uniformly random neurons not yet in ``ids[:n]`` until ``target`` are present
    (``target`` <= n_neurons). ``mark`` is a per-thread stamp array that is never cleared:
    mark[j] == serial means j is already in the set, so no O(n_neurons) clearing per sample."""
    while n < target:
        rng, j = randint(rng, n_neurons)
        if mark[j] != serial:
            mark[j] = serial
            ids[n] = j
            n += 1
    return n, rng


@njit(cache=True, nogil=True)
def _fill_active(n_out, labels, forced, min_active, rng, ids, mark, serial):
    """Dense-free active set without LSH: the true labels (if ``forced``) plus random neurons
    up to ``min_active``. ``mark`` is a per-thread stamp array of length n_out that is never
    cleared: mark[j] == serial means j is already in the set."""
    n = 0
    if forced:
        for i in range(labels.shape[0]):
            j = labels[i]
            if mark[j] != serial:
                mark[j] = serial
                ids[n] = j
                n += 1
    n_kept = n
    n, rng = _pad_random(ids, n, min(min_active, n_out), n_out, rng, mark, serial)
    return n, rng, n_kept


# ----------------------------------------------------------------------------------------------
# One sample
# ----------------------------------------------------------------------------------------------

# cfg: the sparse layers' shared LSH / sampler settings, packed into one int64 array
CFG_SAMPLER, CFG_FAMILY, CFG_K, CFG_L, CFG_BITS, CFG_BUDGET, CFG_THRESHOLD = range(7)
SAMPLER_RANDOM = -1        # no LSH: labels + random neurons (classic sampled softmax)


@njit(cache=True, nogil=True)
def _select_active(l, cfg, in_sparse, in_ids, in_vals, n_in_act, n_in, n_neurons, forced,
                   min_act, rng, intp, floatp, toff, titems, codes, set_keys, set_counts, order,
                   xbuf, mark, serial, out):
    """Active neurons of sparse layer ``l`` for one input vector; returns (count, rng).

    The input is hashed with the layer's functions (a sparse input -- the network input or a
    sparse previous layer -- is scattered into ``xbuf`` and hashed densely, so unsorted active
    ids work too; ``xbuf`` is all-zero between calls), then the sampler picks from the L
    buckets; forced ids (true labels) come first, random neurons pad to ``min_act``. Returns
    (count, rng, n1): out[n1:count] are the random fill (for the random sampler n1 = number of
    distinct forced ids, everything after them is random)."""
    code = cfg[CFG_SAMPLER]
    if code == SAMPLER_RANDOM:
        return _fill_active(n_neurons, forced, True, min_act, rng, out, mark, serial)
    fam = cfg[CFG_FAMILY]
    K = cfg[CFG_K]
    Lh = cfg[CFG_L]
    bits = cfg[CFG_BITS]
    if l == 0:
        # the network input: sorted CSR indices, hash it sparsely
        hash_sparse_into(fam, K, Lh, bits, intp[l], floatp[l], in_ids, in_vals, codes)
    elif in_sparse:
        for m in range(n_in_act):
            xbuf[in_ids[m]] = in_vals[m]
        hash_dense_into(fam, K, Lh, bits, intp[l], floatp[l], xbuf[:n_in], codes)
        for m in range(n_in_act):
            xbuf[in_ids[m]] = 0.0
    else:
        hash_dense_into(fam, K, Lh, bits, intp[l], floatp[l], in_vals[:n_in], codes)
    n1, rng = sample_into(code, codes, toff[l], titems[l], n_neurons, cfg[CFG_BUDGET],
                          cfg[CFG_THRESHOLD], forced, 0, rng, set_keys, set_counts, order, out)
    # random fill up to min_act done here (not by the sampler) so that the caller knows which
    # positions are uniform random negatives: out[n1:n]
    target = min(min_act, n_neurons, out.shape[0])
    n = n1
    if n < target:
        for k in range(n1):
            mark[out[k]] = serial
        n, rng = _pad_random(out, n1, target, n_neurons, rng, mark, serial)
    return n, rng, n1


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def _sample_pass(W, B, GW, GB, n_layers, n_in, n_out, w_off, b_off, a_off, s_off,
                 sparse, min_active, loss_code, cfg, intp, floatp, toff, titems,
                 x_idx, x_val, labels, force_labels, shared, rng, scale,
                 acts, dels, ids, n_act, codes, set_keys, set_counts, order, xbuf, mark, serial,
                 forced_buf, row_path, h_store, d_store, correct, backward, shared_corr):
    """Forward (and optionally backward) of one sample; returns its loss.

    ``acts``/``dels``: this thread's activation/delta scratch (layer l at a_off[l]); ``ids``:
    this sample's active ids of the sparse layers (layer l at s_off[l]); ``n_act[l]`` receives
    the active counts; ``codes``..``mark``, ``forced_buf``: this thread's sampler scratch.
    When ``force_labels`` (training) the true labels and the batch's ``shared`` random
    negatives are forced into the output layer's active set; ``shared_corr`` (length n_out, or
    empty for uniform negatives) holds the log importance weights of the shared negatives,
    indexed by neuron. When ``row_path`` the output
    layer's gradient is not accumulated here: its input (dense form) goes to ``h_store`` and
    its deltas to ``d_store``, for the per-row pass after the batch."""
    last = n_layers - 1
    no_force = labels[:0]
    n_forced = 0
    if force_labels:
        ny = labels.shape[0]
        for i in range(ny):
            forced_buf[i] = labels[i]
        for i in range(shared.shape[0]):
            forced_buf[ny + i] = shared[i]
        n_forced = ny + shared.shape[0]
    out_forced = forced_buf[:n_forced]
    n1 = 0
    # ---- layer 0 (sparse input) ----
    n0 = n_out[0]
    a0 = acts[a_off[0]:a_off[1]]
    if sparse[0]:
        id0 = ids[s_off[0]:s_off[1]]
        cnt, rng, n1 = _select_active(0, cfg, True, x_idx, x_val, x_idx.shape[0], n_in[0], n0,
                                  out_forced if last == 0 else no_force,
                                  min_active[0], rng, intp, floatp, toff, titems, codes,
                                  set_keys, set_counts, order, xbuf, mark[0], serial, id0)
        n_act[0] = cnt
        first_forward_sparse(W, B, w_off[0], b_off[0], n0, x_idx, x_val, id0, cnt, a0)
    else:
        n_act[0] = n0
        first_forward_dense(W, B, w_off[0], b_off[0], n0, x_idx, x_val, a0)
    # ---- later layers ----
    for l in range(1, n_layers):
        a_in = acts[a_off[l - 1]:a_off[l]]
        a_l = acts[a_off[l]:a_off[l + 1]]
        # a diverged network must not reach the hash functions or the samplers: report a NaN
        # loss (the engine raises DivergenceError before any update) and stop here
        chk = np.float32(0.0)
        for m in range(n_act[l - 1]):
            chk += a_in[m] * np.float32(0.0)
        if chk != 0.0 or not np.isfinite(chk):
            for q in range(l, n_layers):
                n_act[q] = 0
            return np.nan
        id_in = ids[s_off[l - 1]:s_off[l]]
        id_l = ids[s_off[l]:s_off[l + 1]]
        if sparse[l]:
            cnt, rng, n1 = _select_active(l, cfg, sparse[l - 1], id_in, a_in, n_act[l - 1],
                                          n_in[l],
                                      n_out[l],
                                      out_forced if l == last else no_force,
                                      min_active[l], rng, intp, floatp, toff, titems, codes,
                                      set_keys, set_counts, order, xbuf, mark[l], serial, id_l)
            n_act[l] = cnt
        else:
            n_act[l] = n_out[l]
        rows_forward(W, B, w_off[l], b_off[l], n_in[l], not sparse[l - 1], id_in, a_in,
                     n_act[l - 1], not sparse[l], id_l, n_act[l], l != last, a_l)
    # ---- loss ----
    z = acts[a_off[last]:a_off[last + 1]]
    d_last = dels[a_off[last]:a_off[last + 1]]
    # sampled softmax correction: the uniform random negatives R' (shared ones at positions
    # [ny, n_fk), per-sample fill at [n1, n)) stand for all U = C - |S| neurons not computed
    # exactly, so their logits get + log(U / |R'|) (the logQ correction of TF's sampled
    # softmax); the normaliser then estimates the full softmax's, and the label gradient
    # p - 1/|y| is that of the dense network
    lo1 = hi1 = lo2 = hi2 = 0
    log_w = 0.0
    weighted = shared_corr.shape[0] > 0
    if sparse[last] and force_labels and loss_code == 0 and correct:
        ny = labels.shape[0]
        n_a = n_act[last]
        if cfg[CFG_SAMPLER] == SAMPLER_RANDOM:
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
                if not _is_label(labels, shared[i]):
                    n_fk += 1
            lo1 = ny
            hi1 = n_fk
            lo2 = n1
            hi2 = n_a
        n_rand = (hi1 - lo1) + (hi2 - lo2)
        if weighted:
            # frequency-proportional shared negatives carry their own weights; a uniform fill
            # estimates the same remainder, so with both present each counts half
            n_fill = hi2 - lo2
            if n_fill > 0:
                u = n_out[last] - (n_a - n_fill)
                log_w = math.log(max(u, 1) / n_fill)
        elif n_rand > 0:
            u = n_out[last] - (n_a - n_rand)
            log_w = math.log(max(u, 1) / n_rand)
    log_w1 = log_w2 = log_w
    corr = shared_corr[:0]
    if weighted and hi1 > lo1:
        corr = shared_corr
        log_w1 = 0.0
        if hi2 > lo2:
            log_w1 = math.log(0.5)
            log_w2 = log_w + math.log(0.5)
    loss = _output_loss(z, n_act[last], not sparse[last], ids[s_off[last]:s_off[last + 1]],
                        labels, loss_code, scale, d_last, lo1, hi1, lo2, hi2, log_w1, log_w2,
                        corr)
    if not backward:
        return loss
    # ---- backward ----
    if row_path:
        for k in range(n_act[last]):
            d_store[k] = d_last[k]
        a_in = acts[a_off[last - 1]:a_off[last]]
        if sparse[last - 1]:
            for i in range(n_in[last]):
                h_store[i] = 0.0
            for m in range(n_act[last - 1]):
                h_store[ids[s_off[last - 1] + m]] = a_in[m]
        else:
            for i in range(n_in[last]):
                h_store[i] = a_in[i]
    for l in range(last, 0, -1):
        a_in = acts[a_off[l - 1]:a_off[l]]
        d_in = dels[a_off[l - 1]:a_off[l]]
        rows_backward(W, GW, GB, w_off[l], b_off[l], n_in[l], not sparse[l - 1],
                      ids[s_off[l - 1]:s_off[l]], a_in, n_act[l - 1], not sparse[l],
                      ids[s_off[l]:s_off[l + 1]], n_act[l], dels[a_off[l]:a_off[l + 1]], d_in,
                      not (row_path and l == last))
        for m in range(n_act[l - 1]):
            if a_in[m] <= 0.0:       # ReLU mask (a_in is the post-ReLU activation)
                d_in[m] = 0.0
    first_backward(GW, GB, w_off[0], b_off[0], n0, x_idx, x_val, not sparse[0],
                   ids[s_off[0]:s_off[1]], n_act[0], dels[a_off[0]:a_off[1]])
    return loss


# ----------------------------------------------------------------------------------------------
# One batch
# ----------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True, error_model="numpy")
def train_batch_kernel(W, B, GW, GB, n_layers, n_in, n_out, w_off, b_off, a_off, s_off,
                       sparse, min_active, loss_code, cfg, intp, floatp, toff, titems,
                       X_ptr, X_ind, X_dat, Y_ptr, Y_ind, rows, seed, serial, shared,
                       acts, dels, ids, n_act, codes, set_keys, set_counts, order, xbuf, marks,
                       forced_buf, row_path, h_store, d_store, correct, losses, shared_corr):
    """Forward + backward of every sample of the batch ``rows``, HOGWILD over samples.

    Thread-chunk scratch (first axis n_chunks): acts, dels, codes, set_keys, set_counts, order,
    xbuf, marks. Per-sample (first axis batch): ids, n_act -- kept after the call, they list the
    touched rows. Gradients of the batch MEAN loss are added into GW/GB without locks. Random
    draws come from stream_seed(seed, serial, sample position): independent of threads."""
    nb = rows.shape[0]
    n_chunks = acts.shape[0]
    scale = 1.0 / nb
    for c in prange(n_chunks):
        lo = (c * nb) // n_chunks
        hi = ((c + 1) * nb) // n_chunks
        for s in range(lo, hi):
            r = rows[s]
            x_idx = X_ind[X_ptr[r]:X_ptr[r + 1]]
            x_val = X_dat[X_ptr[r]:X_ptr[r + 1]]
            labels = Y_ind[Y_ptr[r]:Y_ptr[r + 1]]
            rng = stream_seed(seed, STREAM_SAMPLE + serial * 16, s)
            losses[s] = _sample_pass(W, B, GW, GB, n_layers, n_in, n_out, w_off, b_off, a_off,
                                     s_off, sparse, min_active, loss_code, cfg, intp, floatp,
                                     toff, titems, x_idx, x_val, labels, True, shared, rng,
                                     scale, acts[c], dels[c], ids[s], n_act[s], codes[c],
                                     set_keys[c], set_counts[c], order[c], xbuf[c], marks[c],
                                     serial * 1048576 + s + 1, forced_buf[c], row_path,
                                     h_store[s], d_store[s], correct, True, shared_corr)


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True)
def predict_sparse_kernel(W, B, n_layers, n_in, n_out, w_off, b_off, a_off, s_off,
                          sparse, min_active, cfg, intp, floatp, toff, titems,
                          X_ptr, X_ind, X_dat, seed, call, k, acts, dels, ids, n_act, codes,
                          set_keys, set_counts, order, xbuf, marks, forced_buf, prior,
                          out_ids, out_scores):
    """Top-k over the LSH-selected output neurons plus the ``prior`` ids (the same for every
    row; may be empty): the fast serving path. Rows with fewer than k active neurons are padded
    with id -1 / score -inf."""
    n = X_ptr.shape[0] - 1
    n_chunks = acts.shape[0]
    last = n_layers - 1
    empty_lab = np.zeros(0, dtype=np.int32)
    dummy = np.zeros(1, dtype=np.float32)
    for c in prange(n_chunks):
        for s in range((c * n) // n_chunks, ((c + 1) * n) // n_chunks):
            x_idx = X_ind[X_ptr[s]:X_ptr[s + 1]]
            x_val = X_dat[X_ptr[s]:X_ptr[s + 1]]
            rng = stream_seed(seed, STREAM_PREDICT + call * 16, s)
            _sample_pass(W, B, dummy, dummy, n_layers, n_in, n_out, w_off, b_off, a_off, s_off,
                         sparse, min_active, 0, cfg, intp, floatp, toff, titems, x_idx, x_val,
                         empty_lab, prior.shape[0] > 0, prior, rng, 1.0, acts[c], dels[c],
                         ids[c],
                         n_act[c], codes[c], set_keys[c], set_counts[c], order[c], xbuf[c],
                         marks[c], (call * 1048576 + s + 1) * 2, forced_buf[c], False, dummy,
                         dummy, False, False, dummy[:0])
            z = acts[c, a_off[last]:a_off[last + 1]]
            m = n_act[c, last]
            dense = not sparse[last]
            # insertion sort into the k best (k is small)
            for q in range(k):
                out_ids[s, q] = -1
                out_scores[s, q] = -np.inf
            for t in range(m):
                v = z[t]
                if v <= out_scores[s, k - 1]:
                    continue
                q = k - 1
                while q > 0 and out_scores[s, q - 1] < v:
                    out_scores[s, q] = out_scores[s, q - 1]
                    out_ids[s, q] = out_ids[s, q - 1]
                    q -= 1
                out_scores[s, q] = v
                out_ids[s, q] = t if dense else ids[c, s_off[last] + t]


@njit(cache=True, nogil=True)
def collect_touched(n_layers, n_in, n_out, w_off, b_off, row_off, sparse, s_off,
                    X_ptr, X_ind, rows, ids, n_act, stamp_rows, stamp_bias, serial,
                    starts, lens, bias_ids, row_path, rowids):
    """Deduplicated list of the rows (and biases) the batch touched, for the optimizer.

    Layer 0 rows are the batch's input features (row length n_out[0]); later layers' rows are
    their active neurons (all of them for a dense layer). ``rowids`` receives each listed row's
    index in the per-row arrays (``row_off`` layout: the optimizer's step records). ``stamp_*`` are never cleared:
    stamp == serial means already listed in this batch. Returns (n_rows, n_bias)."""
    nr = 0
    nbias = 0
    nb = rows.shape[0]
    # layer 0: input features
    n0 = n_out[0]
    for s in range(nb):
        r = rows[s]
        for p in range(X_ptr[r], X_ptr[r + 1]):
            f = X_ind[p]
            if stamp_rows[row_off[0] + f] != serial:
                stamp_rows[row_off[0] + f] = serial
                starts[nr] = w_off[0] + np.int64(f) * n0
                lens[nr] = n0
                rowids[nr] = row_off[0] + f
                nr += 1
    n_upd = n_layers - 1 if row_path else n_layers   # the row path updates the output layer
    for l in range(n_upd):
        if sparse[l]:
            for s in range(nb):
                for k in range(n_act[s, l]):
                    j = ids[s, s_off[l] + k]
                    if stamp_bias[b_off[l] + j] != serial:
                        stamp_bias[b_off[l] + j] = serial
                        bias_ids[nbias] = b_off[l] + j
                        nbias += 1
                        if l > 0:
                            starts[nr] = w_off[l] + np.int64(j) * n_in[l]
                            lens[nr] = n_in[l]
                            rowids[nr] = row_off[l] + j
                            nr += 1
        else:
            for j in range(n_out[l]):
                bias_ids[nbias] = b_off[l] + j
                nbias += 1
                if l > 0:
                    starts[nr] = w_off[l] + np.int64(j) * n_in[l]
                    lens[nr] = n_in[l]
                    rowids[nr] = row_off[l] + j
                    nr += 1
    return nr, nbias


@njit(cache=True, nogil=True)
def output_entries(ids, n_act, s_off_last, d_cap, stamp, slot, serial, uniq, row_ptr, ent):
    """Transpose the batch's output-layer active sets into per-row lists.

    uniq[:n_uniq] = distinct active output neurons; for unique row u, ent[row_ptr[u]:
    row_ptr[u+1]] are the flat positions s * d_cap + k of its (sample, active slot) pairs, in
    sample order (so the per-row gradient sums are deterministic). ``stamp`` (never cleared)
    and ``slot`` are per-neuron scratch. Returns n_uniq."""
    nb = n_act.shape[0]
    last = n_act.shape[1] - 1
    nu = 0
    for s in range(nb):
        for k in range(n_act[s, last]):
            j = ids[s, s_off_last + k]
            if stamp[j] != serial:
                stamp[j] = serial
                slot[j] = nu
                uniq[nu] = j
                row_ptr[nu + 1] = 0
                nu += 1
            row_ptr[slot[j] + 1] += 1
    row_ptr[0] = 0
    for u in range(nu):
        row_ptr[u + 1] += row_ptr[u]
    # fill, using row_ptr[u] as a cursor, then shift back
    for s in range(nb):
        for k in range(n_act[s, last]):
            j = ids[s, s_off_last + k]
            u = slot[j]
            ent[row_ptr[u]] = s * d_cap + k
            row_ptr[u] += 1
    for u in range(nu, 0, -1):
        row_ptr[u] = row_ptr[u - 1]
    row_ptr[0] = 0
    return nu


# ----------------------------------------------------------------------------------------------
# Inference
# ----------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True)
def hidden_batch_kernel(W, B, n_layers, n_in, n_out, w_off, b_off, X_ptr, X_ind, X_dat,
                        lo, hi, out, scratch):
    """Last hidden layer of rows lo..hi-1 with EVERY neuron active (the exact network).
    ``out`` [hi-lo, n_in[last]]; ``scratch`` [n_chunks, sum of hidden sizes]."""
    n = hi - lo
    last = n_layers - 1
    n_chunks = scratch.shape[0]
    dummy = np.zeros(1, dtype=np.int32)
    for c in prange(n_chunks):
        buf = scratch[c]
        for s in range((c * n) // n_chunks, ((c + 1) * n) // n_chunks):
            r = lo + s
            x_idx = X_ind[X_ptr[r]:X_ptr[r + 1]]
            x_val = X_dat[X_ptr[r]:X_ptr[r + 1]]
            off = 0
            first_forward_dense(W, B, w_off[0], b_off[0], n_out[0], x_idx, x_val,
                                buf[0:n_out[0]])
            for l in range(1, last):
                rows_forward(W, B, w_off[l], b_off[l], n_in[l], True, dummy,
                             buf[off:off + n_in[l]], n_in[l], True, dummy, n_out[l], True,
                             buf[off + n_in[l]:off + n_in[l] + n_out[l]])
                off += n_in[l]
            for i in range(n_in[last]):
                out[s, i] = buf[off + i]


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True)
def dense_hidden_kernel(W, B, n_layers, n_in, n_out, w_off, b_off, h_off, X_ptr, X_ind, X_dat,
                        rows, acts):
    """Every hidden layer (all neurons) of the batch ``rows``: acts[s, h_off[l]:h_off[l+1]] =
    layer l's output (l < n_layers - 1). Used by the dense (full softmax) training path."""
    nb = rows.shape[0]
    last = n_layers - 1
    dummy = np.zeros(1, dtype=np.int32)
    for s in prange(nb):
        r = rows[s]
        a = acts[s]
        first_forward_dense(W, B, w_off[0], b_off[0], n_out[0], X_ind[X_ptr[r]:X_ptr[r + 1]],
                            X_dat[X_ptr[r]:X_ptr[r + 1]], a[h_off[0]:h_off[1]])
        for l in range(1, last):
            rows_forward(W, B, w_off[l], b_off[l], n_in[l], True, dummy,
                         a[h_off[l - 1]:h_off[l]], n_in[l], True, dummy, n_out[l], True,
                         a[h_off[l]:h_off[l + 1]])


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True)
def dense_backward_kernel(W, GW, GB, n_layers, n_in, n_out, w_off, b_off, h_off, X_ptr, X_ind,
                          X_dat, rows, acts, d_hidden, dels):
    """Back-propagate d_hidden[s] (dLoss/d last hidden output, ReLU mask applied) through the
    hidden layers into GW/GB (racy adds, HOGWILD). ``dels`` [n_chunks, h_off[-1]]."""
    nb = rows.shape[0]
    last = n_layers - 1
    n_chunks = dels.shape[0]
    dummy = np.zeros(1, dtype=np.int32)
    for c in prange(n_chunks):
        dl = dels[c]
        for s in range((c * nb) // n_chunks, ((c + 1) * nb) // n_chunks):
            r = rows[s]
            a = acts[s]
            for i in range(n_in[last]):
                dl[h_off[last - 1] + i] = d_hidden[s, i]
            for l in range(last - 1, 0, -1):
                d_in = dl[h_off[l - 1]:h_off[l]]
                rows_backward(W, GW, GB, w_off[l], b_off[l], n_in[l], True, dummy,
                              a[h_off[l - 1]:h_off[l]], n_in[l], True, dummy, n_out[l],
                              dl[h_off[l]:h_off[l + 1]], d_in, True)
                for m in range(n_in[l]):
                    if a[h_off[l - 1] + m] <= 0.0:
                        d_in[m] = 0.0
            first_backward(GW, GB, w_off[0], b_off[0], n_out[0], X_ind[X_ptr[r]:X_ptr[r + 1]],
                           X_dat[X_ptr[r]:X_ptr[r + 1]], True, dummy, n_out[0],
                           dl[h_off[0]:h_off[1]])


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True, error_model="numpy")
def dense_loss_kernel(Z, Y_ptr, Y_ind, rows, loss_code, scale, losses):
    """In place: Z[s] (logits of the whole output layer) becomes scale * dLoss/dZ; losses[s]
    gets the sample's loss. Same loss as _output_loss, fused into one parallel pass per row."""
    nb = rows.shape[0]
    n = Z.shape[1]
    for s in prange(nb):
        r = rows[s]
        labels = Y_ind[Y_ptr[r]:Y_ptr[r + 1]]
        losses[s] = _output_loss(Z[s], n, True, labels, labels, loss_code, scale, Z[s], 0, 0, 0, 0,
                                 0.0, 0.0, np.zeros(0, np.float32))


def topk_merge(best_s, best_i, scores, base, k):
    """Running top-k: merge the top-k of ``scores`` (columns offset by ``base``) into
    (best_s, best_i), both [n, k], best first."""
    kk = min(k, scores.shape[1])
    part = np.argpartition(-scores, kk - 1, axis=1)[:, :kk]
    cand_s = np.concatenate([best_s, np.take_along_axis(scores, part, axis=1)], axis=1)
    cand_i = np.concatenate([best_i, part.astype(np.int64) + base], axis=1)
    order = np.argsort(-cand_s, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(cand_s, order, axis=1), np.take_along_axis(cand_i, order, axis=1)


# ----------------------------------------------------------------------------------------------
# Rehash schedule
# ----------------------------------------------------------------------------------------------

class RehashSchedule:
    """When to rehash the LSH tables and rebuild the hash functions (SLIDE paper, sec. 4.2).

    The t-th rehash (t = 0, 1, ...) comes T_t = T_0 * exp(lambda * t) batches after the
    previous one (rounded, at least 1); rebuilds follow the same law with their own T_0
    (``rebuild_period``) and their own counter. lambda = 0 gives fixed periods. A rebuild also
    re-inserts every neuron, so a batch where both are due performs only the rebuild (and
    counts as both). The state (counters and next due batches) is plain ints: saved in
    checkpoints so a resumed run follows the same schedule.
    """

    def __init__(self, rehash_period, rebuild_period, decay):
        self.rehash_period = float(rehash_period)
        self.rebuild_period = float(rebuild_period)
        self.decay = float(decay)
        self.n_rehash = 0
        self.n_rebuild = 0
        self.next_rehash = self.period(self.rehash_period, 0)
        self.next_rebuild = self.period(self.rebuild_period, 0)

    def period(self, base, t):
        return max(1, int(round(base * math.exp(self.decay * t))))

    def periods(self, n, rebuild=False):
        """The first n periods (in batches), for inspection and tests."""
        base = self.rebuild_period if rebuild else self.rehash_period
        return [self.period(base, t) for t in range(n)]

    def step(self, batch):
        """Call after batch number ``batch`` (1-based count of batches trained so far).
        Returns (rehash, rebuild) flags for what is due now."""
        rehash = rebuild = False
        if batch >= self.next_rebuild:
            rebuild = True
            self.n_rebuild += 1
            self.next_rebuild = batch + self.period(self.rebuild_period, self.n_rebuild)
        if batch >= self.next_rehash:
            rehash = True
            self.n_rehash += 1
            self.next_rehash = batch + self.period(self.rehash_period, self.n_rehash)
        return rehash, rebuild

    def state(self):
        return [self.n_rehash, self.n_rebuild, self.next_rehash, self.next_rebuild]

    def set_state(self, st):
        self.n_rehash, self.n_rebuild, self.next_rehash, self.next_rebuild = (int(v) for v in st)


@njit(cache=True, nogil=True, parallel=True)
def hash_rows_into(family_code, K, L, bits, int_params, float_params, W, all_rows, rows, codes):
    """codes[r] = bucket ids of W[r] for r in ``rows`` (every row when ``all_rows``), in
    place: the same values as ``hash_dense_batch`` without copying the rows out of W, the
    full-matrix finiteness scan, or a scatter back (the engine never applies a non-finite
    update, so its weights are finite)."""
    if all_rows:
        for r in prange(W.shape[0]):
            hash_dense_into(family_code, K, L, bits, int_params, float_params, W[r], codes[r])
    else:
        for q in prange(rows.shape[0]):
            r = rows[q]
            hash_dense_into(family_code, K, L, bits, int_params, float_params, W[r], codes[r])


# ----------------------------------------------------------------------------------------------
# Network: owns the arrays and calls the kernels
# ----------------------------------------------------------------------------------------------

def _i64(a):
    return np.ascontiguousarray(a, dtype=np.int64)


class Network:
    """Parameters, gradient buffers, LSH indices and per-fit scratch of one network.

    ``sizes = (n_features, h1, ..., n_labels)``; ``sparse[l]`` says whether layer l selects
    active neurons instead of computing all of them; ``min_active[l]`` pads a sparse layer's
    active set with random neurons. ``lsh`` (for sparse layers): dict(sampler, family, K, L,
    range_pow, bucket_size, policy, budget, threshold); sampler "random" needs no tables.
    """

    def __init__(self, sizes, sparse, min_active, loss="softmax", seed=0, lsh=None, init=True,
                 shared_negatives=0, correct=True, negative_power=0.0):
        from slide.layers import Layout, init_params
        self.layout = Layout(tuple(int(s) for s in sizes))
        L = self.layout.n_layers
        self.sparse = np.asarray(sparse, dtype=np.bool_).reshape(L)
        self.min_active = _i64(min_active).reshape(L)
        self.loss_code = LOSSES[loss]
        self.seed = int(seed)
        lay = self.layout
        if init:
            self.W, self.B = init_params(lay, self.seed)
        else:
            self.W = np.zeros(lay.n_weights, np.float32)
            self.B = np.zeros(lay.n_biases, np.float32)
        # a sampled output layer takes the per-row path (slide.optim.output_step): its gradient
        # never lives in a buffer, so the buffers stop where the output layer starts
        self.row_path = bool(self.sparse[-1]) and L > 1
        last = L - 1
        self.GW = np.zeros(int(lay.w_off[last]) if self.row_path else lay.n_weights, np.float32)
        self.GB = np.zeros(int(lay.b_off[last]) if self.row_path else lay.n_biases, np.float32)
        self.n_shared = int(shared_negatives) if self.sparse[-1] else 0
        self.correct = bool(correct)
        # shared negatives: uniform (power 0) or proportional to (label count + 1)^power;
        # the cdf is set from the training labels (set_label_counts)
        self.negative_power = float(negative_power)
        self._neg_cdf = None
        self._neg_q = None
        self.shared_corr = np.zeros(int(lay.n_out[-1]) if self.negative_power > 0 else 0,
                                    np.float32)
        self.n_in, self.n_out = lay.n_in, lay.n_out
        self.w_off, self.b_off, self.row_off = lay.w_off, lay.b_off, lay.row_off
        self.stamp_rows = np.zeros(int(self.row_off[-1]), np.int64)
        self.stamp_bias = np.zeros(lay.n_biases, np.int64)
        self.lsh = dict(lsh or {"sampler": "random"})
        self.lsh.setdefault("sampler", "random")
        self.indices = {}            # layer -> LSHIndex
        self._codes = {}             # layer -> cached bucket ids [n_out, L] (output layer)
        self._hashed_at = {}         # layer -> serial of the batch its codes were taken after
        self.last_dirty = 0
        self.out_stamp = np.zeros(int(lay.n_out[-1]) if self.row_path else 1, np.int64)
        self._scratch_key = None
        self.cfg = np.zeros(7, np.int64)
        self.cfg[CFG_SAMPLER] = SAMPLER_RANDOM
        if self.uses_tables:
            from slide.lsh.hashes import FAMILIES, bits_per_hash
            from slide.lsh.samplers import SAMPLERS
            c = self.lsh
            self.cfg[:] = [SAMPLERS[c["sampler"]], FAMILIES[c["family"]], c["K"], c["L"],
                           bits_per_hash(c["family"], c["K"], c["range_pow"]), c["budget"],
                           c["threshold"]]
        elif self.sparse.any():
            self.cfg[CFG_BUDGET] = 0
        self._pack_lsh()

    @property
    def uses_tables(self):
        return bool(self.sparse.any()) and self.lsh["sampler"] != "random"

    # -- LSH ---------------------------------------------------------------------------------
    def weight_rows(self, l):
        """Layer l's neurons as rows [n_out, n_in] (the vectors the tables hash)."""
        Wl = self.layout.weight_view(self.W, l)
        return np.ascontiguousarray(Wl.T) if l == 0 else Wl

    def layer_seed(self, l):
        return int(stream_seed(np.uint64(self.seed), 500, l)) >> 1

    def build_indices(self):
        """Hash every sparse layer's neurons into fresh tables."""
        if not self.uses_tables:
            return
        from slide.lsh.index import LSHIndex
        c = self.lsh
        for l in range(self.layout.n_layers):
            if self.sparse[l]:
                idx = LSHIndex(c["family"], int(self.n_in[l]), c["K"], c["L"], c["range_pow"],
                               bucket_size=c["bucket_size"], policy=c["policy"],
                               seed=self.layer_seed(l))
                self.indices[l] = idx
                self._refill(l, full=True)
        self._pack_lsh()

    def weights_finite(self):
        return bool(np.isfinite(self.W).all() and np.isfinite(self.B).all())

    # Incremental rehashing of the output layer. The sparse optimizer changes only the rows a
    # batch touched (out_stamp[j] = serial of the last batch that updated row j), so a rehash
    # re-hashes only the rows touched since the previous one and reuses the cached bucket ids
    # of the others: a neuron's bucket ids are a function of its weights alone, so the tables
    # are exactly those a full rehash would build (same codes, same insertion seed).

    def _refill(self, l, full, serial=0):
        """(Re)fill layer l's tables from its current weights (generation unchanged)."""
        idx = self.indices[l]
        rows = self.weight_rows(l)
        cache = self._codes.get(l)
        incremental = self.row_path and l == self.layout.n_layers - 1
        hf = idx.hf
        if full or cache is None or not incremental:
            codes = cache if (cache is not None and cache.shape == (rows.shape[0], hf.L)) \
                else np.empty((rows.shape[0], hf.L), np.int32)
            hash_rows_into(hf.family_code, hf.K, hf.L, hf.bits, hf.int_params, hf.float_params,
                           rows, True, np.zeros(0, np.int64), codes)
        else:
            dirty = np.flatnonzero(self.out_stamp > self._hashed_at.get(l, 0))
            codes = cache
            if dirty.size:
                hash_rows_into(hf.family_code, hf.K, hf.L, hf.bits, hf.int_params,
                               hf.float_params, rows, False, dirty, codes)
            self.last_dirty = int(dirty.size)
        if incremental:
            self._codes[l] = codes
            self._hashed_at[l] = int(serial)
        idx.ensure_tables(rows.shape[0])
        build_tables_into(codes, idx.bucket_size, idx.policy_code, idx.table_seed(),
                          idx.offsets, idx.items)

    def rehash(self, serial=0):
        """Reinsert every neuron of every sparse layer (same hash functions); the output layer
        re-hashes only the rows updated since the previous (re)hash."""
        for l, idx in self.indices.items():
            idx.generation += 1     # as LSHIndex.rehash: fresh insertion orders
            self._refill(l, full=False, serial=serial)
        self._pack_lsh()

    def rebuild(self, serial=0):
        """New hash functions for every sparse layer, then reinsert every neuron (as
        LSHIndex.rebuild; the new seed is derived from the index's current seed, which the
        checkpoint keeps, so a resumed run draws the same functions)."""
        from slide.lsh.hashes import draw_hash_functions
        for l, idx in self.indices.items():
            idx.seed = int(stream_seed(np.uint64(idx.seed), 501, 0)) >> 1
            idx.hf = draw_hash_functions(idx.hf.family_code, idx.dim, idx.K, idx.L,
                                         idx.range_pow, idx.seed, doph_top=idx.doph_top)
            idx.generation = 0
            self._refill(l, full=True, serial=serial)
        self._pack_lsh()

    def _pack_lsh(self):
        """Typed lists of the per-layer LSH arrays, as the kernels take them (dummies for layers
        without tables)."""
        from numba.typed import List
        di = np.zeros((1, 1), np.int32)
        df = np.zeros((1, 1), np.float32)
        intp, floatp, toff, titems = List(), List(), List(), List()
        for l in range(self.layout.n_layers):
            idx = self.indices.get(l)
            if idx is None:
                intp.append(di)
                floatp.append(df)
                toff.append(di)
                titems.append(di)
            else:
                intp.append(idx.hf.int_params)
                floatp.append(idx.hf.float_params)
                toff.append(idx.offsets)
                titems.append(idx.items)
        self.lsh_lists = (intp, floatp, toff, titems)

    # -- scratch -----------------------------------------------------------------------------
    def capacity(self, l, max_forced, min_act):
        """Most active neurons layer l can have for one sample."""
        n = int(self.n_out[l])
        if not self.sparse[l]:
            return n
        return min(n, max(max_forced + int(self.cfg[CFG_BUDGET]), int(min_act), 1))

    def _scratch(self, n_samples_slots, n_chunks, max_labels, min_active, n_shared=0):
        """Allocate per-thread and per-sample scratch for the kernels."""
        from slide.lsh.samplers import scratch_sizes
        L = self.layout.n_layers
        last = L - 1
        n_forced = max_labels + n_shared
        caps = [self.capacity(l, n_forced if l == last else 0, min_active[l])
                for l in range(L)]
        sc = {}
        sc["a_off"] = _i64(np.concatenate([[0], np.cumsum(caps)]))
        scap = [caps[l] if self.sparse[l] else 0 for l in range(L)]
        sc["s_off"] = _i64(np.concatenate([[0], np.cumsum(scap)]))
        tot = int(sc["a_off"][-1])
        sc["acts"] = np.zeros((n_chunks, tot), np.float32)
        sc["dels"] = np.zeros((n_chunks, tot), np.float32)
        sc["ids"] = np.zeros((n_samples_slots, max(1, int(sc["s_off"][-1]))), np.int32)
        sc["n_act"] = np.zeros((n_samples_slots, L), np.int64)
        if self.uses_tables:
            c = self.lsh
            sz = scratch_sizes(c["sampler"], c["L"], c["bucket_size"], c["budget"], n_forced,
                               int(max(min_active)))
            set_size, order_size, n_codes = sz["set_size"], sz["order_size"], c["L"]
        else:
            set_size, order_size, n_codes = 1, 1, 1
        sc["codes"] = np.zeros((n_chunks, n_codes), np.int32)
        sc["set_keys"] = np.full((n_chunks, set_size), -1, np.int32)
        sc["set_counts"] = np.zeros((n_chunks, set_size), np.int32)
        sc["order"] = np.zeros((n_chunks, order_size), np.int32)
        max_in = max([int(self.n_in[l]) for l in range(1, L) if self.sparse[l]] or [1])
        sc["xbuf"] = np.zeros((n_chunks, max_in), np.float32)
        # per-thread stamps for the random fill (never cleared: stamp == serial means taken)
        mlen = max([int(self.n_out[l]) for l in range(L) if self.sparse[l] and min_active[l] > 0]
                   + [int(self.n_out[l]) for l in range(L) if self.sparse[l]
                      and not self.uses_tables] or [1])
        sc["marks"] = np.zeros((n_chunks, L, mlen), np.int64)
        sc["forced_buf"] = np.zeros((n_chunks, max(1, n_forced)), np.int32)
        return sc

    def prepare(self, batch_size, n_chunks, max_labels):
        """Allocate the per-fit scratch (once; reused while shapes allow)."""
        key = (int(batch_size), int(n_chunks), int(max_labels))
        if self._scratch_key == key:
            return
        self._scratch_key = None
        self.sc = sc = self._scratch(batch_size, n_chunks, int(max_labels), self.min_active,
                                     self.n_shared)
        last = self.layout.n_layers - 1
        if self.row_path:
            cap = int(sc["a_off"][last + 1] - sc["a_off"][last])
            n_o = int(self.n_out[last])
            sc["h_store"] = np.zeros((batch_size, int(self.n_in[last])), np.float32)
            sc["d_store"] = np.zeros((batch_size, cap), np.float32)
            sc["stamp_out"] = self.out_stamp       # persists across fits: marks dirty rows
            sc["slot_out"] = np.zeros(n_o, np.int32)
            sc["uniq"] = np.zeros(min(n_o, batch_size * cap), np.int32)
            sc["row_ptr"] = np.zeros(min(n_o, batch_size * cap) + 1, np.int64)
            sc["ent"] = np.zeros(batch_size * cap, np.int64)
            sc["g_out"] = np.zeros((n_chunks, int(self.n_in[last])), np.float32)
        else:
            sc["h_store"] = np.zeros((1, 1), np.float32)
            sc["d_store"] = np.zeros((1, 1), np.float32)
        self.losses = np.zeros(batch_size, np.float64)
        self.t_starts = np.zeros(int(self.row_off[-1]), np.int64)
        self.t_lens = np.zeros(int(self.row_off[-1]), np.int64)
        self.t_rowids = np.zeros(int(self.row_off[-1]), np.int64)
        self.t_bias = np.zeros(self.layout.n_biases, np.int64)
        self._scratch_key = key

    # -- training ----------------------------------------------------------------------------
    def set_label_counts(self, counts):
        """Training-label counts (length n_labels) for frequency-proportional negatives."""
        if self.negative_power <= 0 or self.n_shared == 0:
            return
        q = (np.asarray(counts, np.float64) + 1.0) ** self.negative_power
        q /= q.sum()
        self._neg_q = q
        self._neg_cdf = np.cumsum(q)
        self._neg_cdf[-1] = 1.0

    def shared_negatives(self, seed, serial):
        """The batch's shared negative output neurons (deduplicated), from (seed, serial).

        Uniform, or (``negative_power`` > 0) drawn with probability q_j ~ (count_j + 1)^power
        so the frequent labels -- which hold most of the softmax's mass -- are almost always
        among them; then ``shared_corr[j]`` = -log P(j drawn at least once in n draws), the
        importance weight that makes the sampled normaliser estimate the full one."""
        if self.n_shared == 0:
            return np.zeros(0, np.int32)
        g = np.random.default_rng([int(seed), int(serial), 0x5EED])
        n_o = int(self.n_out[-1])
        if self.negative_power <= 0:
            return np.unique(g.integers(0, n_o, self.n_shared)).astype(np.int32)
        if self._neg_cdf is None:
            self.set_label_counts(np.zeros(n_o))
        draws = np.searchsorted(self._neg_cdf, g.random(self.n_shared), side="right")
        ids = np.unique(np.minimum(draws, n_o - 1)).astype(np.int32)
        q = self._neg_q[ids]
        p_in = -np.expm1(self.n_shared * np.log1p(-np.minimum(q, 1.0 - 1e-12)))
        self.shared_corr[ids] = -np.log(np.maximum(p_in, 1e-300))
        return ids

    def forward_backward(self, X, Y, rows, seed, serial):
        """Gradients of the batch mean loss into GW/GB (no update; on the row path the output
        layer's deltas and inputs go to the scratch instead). Returns per-sample losses."""
        nb = rows.shape[0]
        sc = self.sc
        shared = self.shared_negatives(seed, serial)
        intp, floatp, toff, titems = self.lsh_lists
        train_batch_kernel(self.W, self.B, self.GW, self.GB, self.layout.n_layers, self.n_in,
                           self.n_out, self.w_off, self.b_off, sc["a_off"], sc["s_off"],
                           self.sparse, self.min_active, self.loss_code, self.cfg, intp, floatp,
                           toff, titems, X.indptr, X.indices, X.data, Y.indptr, Y.indices, rows,
                           np.uint64(seed), np.int64(serial), shared, sc["acts"], sc["dels"],
                           sc["ids"][:nb], sc["n_act"][:nb], sc["codes"], sc["set_keys"],
                           sc["set_counts"], sc["order"], sc["xbuf"], sc["marks"],
                           sc["forced_buf"], self.row_path, sc["h_store"], sc["d_store"],
                           self.correct, self.losses[:nb], self.shared_corr)
        return self.losses[:nb]

    def touched(self, X, rows, serial):
        nb = rows.shape[0]
        sc = self.sc
        return collect_touched(self.layout.n_layers, self.n_in, self.n_out, self.w_off,
                               self.b_off, self.row_off, self.sparse, sc["s_off"], X.indptr,
                               X.indices, rows, sc["ids"][:nb], sc["n_act"][:nb],
                               self.stamp_rows, self.stamp_bias, np.int64(serial),
                               self.t_starts, self.t_lens, self.t_bias, self.row_path,
                               self.t_rowids)

    def train_batch(self, X, Y, rows, seed, serial, optimizer):
        """One batch: kernel, touched rows, optimizer step. Returns (mean loss, mean active
        output neurons)."""
        losses = self.forward_backward(X, Y, rows, seed, serial)
        nb = rows.shape[0]
        loss = float(losses.mean())
        if math.isfinite(loss):         # a diverged batch is reported, never applied
            self.update(X, rows, serial, optimizer)
        return loss, float(self.sc["n_act"][:nb, -1].mean())

    def train_batch_dense(self, X, Y, rows, serial, optimizer):
        """The dense (full softmax) network's batch: hidden layers per sample in a kernel, the
        output layer as BLAS matrix products over the whole batch (as TensorFlow computes it),
        hidden backward per sample (HOGWILD), then the same sparse optimizer (every output row
        is touched). Mathematically the same network as the per-sample path with every neuron
        active; used for sampler="dense"."""
        import numba
        lay = self.layout
        L = lay.n_layers
        last = L - 1
        nb = rows.shape[0]
        hs = lay.sizes[1:-1]
        h_off = _i64(np.concatenate([[0], np.cumsum(hs)]))
        key = ("dense", nb)
        if getattr(self, "_dense_key", None) != key:
            self._dense_acts = np.zeros((nb, int(h_off[-1])), np.float32)
            self._dense_dels = np.zeros((numba.get_num_threads(), int(h_off[-1])), np.float32)
            self._dense_key = key
        acts = self._dense_acts
        dense_hidden_kernel(self.W, self.B, L, self.n_in, self.n_out, self.w_off, self.b_off,
                            h_off, X.indptr, X.indices, X.data, rows, acts)
        H = acts[:, int(h_off[last - 1]):int(h_off[last])]
        Wo = lay.weight_view(self.W, last)
        bo = lay.bias_view(self.B, last)
        Z = H @ Wo.T
        Z += bo
        losses = np.zeros(nb, np.float64)
        dense_loss_kernel(Z, Y.indptr, Y.indices, rows, self.loss_code, 1.0 / nb, losses)
        loss = float(np.mean(losses))
        if not math.isfinite(loss):
            return loss, float(lay.sizes[-1])
        GWo = lay.weight_view(self.GW, last)
        np.matmul(Z.T, H, out=GWo)
        lay.bias_view(self.GB, last)[:] = Z.sum(axis=0)
        dH = Z @ Wo
        dH *= H > 0
        dense_backward_kernel(self.W, self.GW, self.GB, L, self.n_in, self.n_out, self.w_off,
                              self.b_off, h_off, X.indptr, X.indices, X.data, rows, acts,
                              np.ascontiguousarray(dH, dtype=np.float32), self._dense_dels)
        self.update(X, rows, serial, optimizer)
        return loss, float(lay.sizes[-1])

    def update(self, X, rows, serial, optimizer):
        """The optimizer step after ``forward_backward`` of the batch ``rows``: touched rows of
        the buffered layers, then the output layer's per-row path."""
        nr, nbias = self.touched(X, rows, serial)
        optimizer.step(self.W, self.B, self.GW, self.GB, self.t_starts, self.t_lens, nr,
                       self.t_bias, nbias, self.t_rowids)
        nb = rows.shape[0]
        if self.row_path:
            sc = self.sc
            last = self.layout.n_layers - 1
            nu = output_entries(sc["ids"][:nb], sc["n_act"][:nb], sc["s_off"][last],
                                sc["d_store"].shape[1], sc["stamp_out"], sc["slot_out"],
                                np.int64(serial), sc["uniq"], sc["row_ptr"], sc["ent"])
            optimizer.step_output(self.W, self.B, self.w_off[last], self.b_off[last],
                                  self.n_in[last], sc["uniq"], nu, sc["row_ptr"], sc["ent"],
                                  sc["d_store"], sc["h_store"], sc["g_out"])

    def sample_loss_and_grads(self, x_indices, x_data, labels, serial=1, return_active=False):
        """Loss and gradients (flat GW, GB) of ONE sample, without updating anything (its
        active sets are those of batch ``serial``, position 0). For tests: compare with a
        dense reference / finite differences. With ``return_active`` also a list with each
        layer's active neuron ids (None for a dense layer)."""
        import scipy.sparse as sp
        n_f = int(self.layout.sizes[0])
        x_indices = np.asarray(x_indices, np.int32)
        X = sp.csr_matrix((np.asarray(x_data, np.float32), x_indices,
                           np.array([0, len(x_indices)])), shape=(1, n_f))
        X.indptr = X.indptr.astype(np.int64)
        lab = np.sort(np.asarray(labels, np.int32))
        Y = sp.csr_matrix((np.ones(len(lab), np.float32), lab, np.array([0, len(lab)])),
                          shape=(1, int(self.layout.sizes[-1])))
        Y.indptr = Y.indptr.astype(np.int64)
        old = (self.GW, self.GB, getattr(self, "sc", None), getattr(self, "losses", None),
               self._scratch_key)
        self.GW = np.zeros_like(self.GW)
        self.GB = np.zeros_like(self.GB)
        self._scratch_key = None
        try:
            self.prepare(1, 1, max(1, len(lab)))
            loss = self.forward_backward(X, Y, np.zeros(1, np.int64), self.seed, serial)[0]
            GW = np.zeros(self.layout.n_weights, np.float32)
            GB = np.zeros(self.layout.n_biases, np.float32)
            GW[:self.GW.shape[0]] = self.GW
            GB[:self.GB.shape[0]] = self.GB
            if self.row_path:
                # the output layer's gradient, as slide.optim.output_step forms it
                last = self.layout.n_layers - 1
                a = int(self.sc["s_off"][last])
                n_i = int(self.n_in[last])
                for k in range(int(self.sc["n_act"][0, last])):
                    j = int(self.sc["ids"][0, a + k])
                    d = self.sc["d_store"][0, k]
                    o = int(self.w_off[last]) + j * n_i
                    GW[o:o + n_i] = d * self.sc["h_store"][0]
                    GB[int(self.b_off[last]) + j] = d
            self.GW, self.GB = GW, GB
            if not return_active:
                return float(loss), self.GW, self.GB
            act = []
            for l in range(self.layout.n_layers):
                if self.sparse[l]:
                    a = int(self.sc["s_off"][l])
                    act.append(self.sc["ids"][0, a:a + int(self.sc["n_act"][0, l])].copy())
                else:
                    act.append(None)
            return float(loss), self.GW, self.GB, act
        finally:
            self.GW, self.GB, self.sc, self.losses, self._scratch_key = old

    # -- inference ---------------------------------------------------------------------------
    def hidden(self, X, lo=0, hi=None, n_chunks=None):
        """Last hidden layer (every neuron active) of rows lo..hi-1: float32 [n, h_last]."""
        import numba
        hi = X.shape[0] if hi is None else hi
        L = self.layout.n_layers
        n_chunks = n_chunks or numba.get_num_threads()
        out = np.zeros((hi - lo, int(self.n_in[L - 1])), np.float32)
        scratch = np.zeros((n_chunks, int(sum(self.layout.sizes[1:-1]))), np.float32)
        hidden_batch_kernel(self.W, self.B, L, self.n_in, self.n_out, self.w_off, self.b_off,
                            X.indptr, X.indices, X.data, lo, hi, out, scratch)
        return out

    def output_view(self):
        lay = self.layout
        L = lay.n_layers
        return lay.weight_view(self.W, L - 1), lay.bias_view(self.B, L - 1)

    def predict_topk_exact(self, X, k, block=1024, chunk=32768):
        """Exact top-k over ALL output neurons: hidden layer of a block of samples, then BLAS
        scores against chunks of the output rows with a running top-k."""
        Wo, bo = self.output_view()
        n = X.shape[0]
        n_lab = Wo.shape[0]
        k_eff = min(k, n_lab)
        out = np.zeros((n, k_eff), np.int64)
        # all hidden rows first (one parallel kernel), then only BLAS: alternating Numba's
        # OpenMP pool and OpenBLAS's threads makes each spin against the other
        H_all = self.hidden(X)
        for lo in range(0, n, block):
            hi = min(n, lo + block)
            H = H_all[lo:hi]
            best_s = np.full((hi - lo, 0), -np.inf, np.float32)
            best_i = np.zeros((hi - lo, 0), np.int64)
            for c0 in range(0, n_lab, chunk):
                c1 = min(n_lab, c0 + chunk)
                S = H @ Wo[c0:c1].T
                S += bo[c0:c1]
                best_s, best_i = topk_merge(best_s, best_i, S, c0, k_eff)
            out[lo:hi] = best_i
        return out

    def prior_ids(self, n):
        """The ``n`` output neurons with the highest bias (the most probable labels a priori),
        as int32; empty for n = 0 or a dense output layer."""
        _, bo = self.output_view()
        n = min(int(n), bo.shape[0])
        if n <= 0 or not self.sparse[-1]:
            return np.zeros(0, np.int32)
        if n == bo.shape[0]:
            return np.arange(n, dtype=np.int32)
        return np.argpartition(-bo, n - 1)[:n].astype(np.int32)

    def predict_topk_sparse(self, X, k, call=0, prior_candidates=0):
        """Top-k over the neurons the samplers select (no labels forced) plus the
        ``prior_candidates`` highest-bias output neurons, parallel over rows. Padded with -1
        where fewer than k neurons are active."""
        import numba
        n_chunks = numba.get_num_threads()
        mins = self.min_active.copy()
        mins[-1] = int(k)      # serving: random fill only to guarantee k candidates
        prior = self.prior_ids(prior_candidates)
        sc = self._scratch(n_chunks, n_chunks, 0, mins, prior.shape[0])
        intp, floatp, toff, titems = self.lsh_lists
        n = X.shape[0]
        out_ids = np.full((n, k), -1, np.int64)
        out_scores = np.full((n, k), -np.inf, np.float32)
        predict_sparse_kernel(self.W, self.B, self.layout.n_layers, self.n_in, self.n_out,
                              self.w_off, self.b_off, sc["a_off"], sc["s_off"], self.sparse,
                              mins, self.cfg, intp, floatp, toff, titems, X.indptr, X.indices,
                              X.data, np.uint64(self.seed), np.int64(call), int(k), sc["acts"],
                              sc["dels"], sc["ids"], sc["n_act"], sc["codes"], sc["set_keys"],
                              sc["set_counts"], sc["order"], sc["xbuf"], sc["marks"],
                              sc["forced_buf"], prior, out_ids, out_scores)
        return out_ids

    def predict_scores(self, X, block=1024):
        """Dense output scores (logits) [n, n_labels] of the exact network."""
        Wo, bo = self.output_view()
        n = X.shape[0]
        out = np.empty((n, Wo.shape[0]), np.float32)
        H_all = self.hidden(X)
        for lo in range(0, n, block):
            hi = min(n, lo + block)
            out[lo:hi] = H_all[lo:hi] @ Wo.T + bo
        return out
