"""The batched engine's kernels: a sampled output layer's shared block through BLAS.

Every sample of a batch has the batch's shared negatives S in its output active set (the
frequency draw of ``slide.kernels.negatives``). The per-sample path (``slide.network.batch``)
scores them sample by sample in scalar loops; here they are three dense products for the
whole batch, and only what differs between samples -- its true labels and LSH ids outside S,
its random fill -- goes through per-sample loops:

    1. per sample (HOGWILD threads):  hidden layers forward; the output active set selected
       exactly as the per-sample path selects it (``sample.select_active``), each active id
       mapped to its column in S or to the sample's "extras"; H[s] = last hidden layer
    2. W_S, b_S = the rows of S (a gather, each of step 3's BLAS tasks its own columns)
    3. Z = H @ W_S.T                                                      GEMM  [B, |S|]
    4. per sample: logits of the extras (dot products; a sample with many has them cut into
       tasks that step 3's parallel loop takes, ``slide.network.extras``), the corrected
       softmax of ``sample.output_loss`` over S + extras in the per-sample path's order; its
       deltas go back into Z (dZ, in place) and, for the extras, into the row path's store
    5. dH = dZ @ W_S                                                       GEMM  [B, h]
       dW_S = dZ.T @ H,  db_S = column sums of dZ                          GEMM  [|S|, h]
    6. per sample: dH[s] += the extras' rows times their deltas (such a sample's tasks: beside
       step 5's products); back-propagate into the hidden layers (``sample.backward_from``,
       gradients added without locks)
    7. optimizer: hidden layers' touched rows; then in one parallel loop the first layer's
       rows, the extras' rows by the row path and S's rows from dW_S:
       ``row_steps.batch_row_steps``

The active sets, the correction and the loss are the per-sample path's own functions, so both
paths optimise the same objective; they differ only in the order of float32 sums
(tests/test_block.py compares them). Samples are dealt to threads dynamically (a chunk of a
few samples at a time, fewer where the threads are many), so a core that is busy with another
job does not hold the batch. The frequency draw of S is made ahead for the next batches, one
batch a thread (``_draw``): on many cores a batch's own draw was a serial step.
``slide.network.block_step`` calls these steps in order, as one compiled call a batch.
"""
import math

import numba
import numpy as np
from numba import prange

from slide.kernels.arrays import make_feature_rows
from slide.kernels.expsum import exp_shifted_inplace, max_and_finite, max_or_nan
from slide.kernels.jit import njit
from slide.kernels.layers import FASTMATH, PREFETCH_AHEAD
from slide.kernels.losses import LOSS_SIGMOID, each_row, offset_row
from slide.kernels.negatives import (CORR_MIX, CORR_NONE, CORR_PLAIN, corr_array,
                                     correction_kind, seek_sorted, sorted_union)
from slide.kernels.prefetch import prefetch_row
from slide.kernels.rng import STREAM_SAMPLE, STREAM_SERIAL_STRIDE, stream_seed
from slide.kernels.sample import (backward_from, forward_into, mark_stamp, output_loss,
                                  sort_small)
from slide.kernels.touched import batch_entries, feature_entries
from slide.network.extras import add_delta_rows, extras_logits, fill_offsets, row_logit
from slide.network.products import (product_parts, split_backward_products,  # noqa: F401
                                    split_forward_product)


# samples a thread takes at a time (dynamic scheduling of the per-sample loops)
CHUNK = 4


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True, error_model="numpy")
def block_forward(params, spec, tables, sc, blk, X, Y, rows, seed, serial, shared, exact, H,
                  losses, frows):
    """Step 1 for every sample of ``rows``: hidden layers into ``blk.acts[s]``, the output
    active set into ``sc.ids[s]`` / ``sc.n_act[s]`` (layout [C | S minus C | fill], see
    ``sample.select_active``; ``exact``, sorted ids every sample computes exactly, join its
    labels in C), ``blk.col[s, k]`` = column in ``shared`` of active id k (-1:
    an extra), ``blk.extra[s, :n]`` the extras' ids, ``blk.counts[s]`` = (n_c, n_s, n_extra),
    H[s] = the output layer's input. A sample whose hidden layers are non-finite gets loss
    NaN (the caller then applies nothing). With a non-empty ``frows``, one more task of the
    loop, the first, lists the batch's input by feature for step 7
    (``touched.feature_entries``): serial, it runs beside the other threads' samples
    instead of before the first-layer step."""
    nb = rows.shape[0]
    last = spec.n_layers - 1
    a_off, s_off = sc.a_off, sc.s_off
    n_h = spec.n_in[last]
    # bundle members out before the prange: Numba's parfor lowering drops stores made through
    # a tuple attribute inside the loop (see slide.network.row_steps.batch_row_steps)
    b_acts, b_col, b_extra, counts, sc_ids, sc_n_act = (blk.acts, blk.col, blk.extra,
                                                        blk.counts, sc.ids, sc.n_act)
    b_forced = blk.forced
    sc_forced = sc.forced_buf
    n_list = 1 if frows.mark.shape[0] > 0 else 0
    # the softmax's row pass reads only C's columns (``_active_columns``)
    lazy = spec.loss_code != LOSS_SIGMOID
    for task in prange(nb + n_list):
        if task < n_list:
            feature_entries(X, rows, frows)
            continue
        s = task - n_list
        t = numba.get_thread_id()
        r = rows[s]
        x_idx = X.ind[X.ptr[r]:X.ptr[r + 1]]
        x_val = X.dat[X.ptr[r]:X.ptr[r + 1]]
        labels = Y.ind[Y.ptr[r]:Y.ptr[r + 1]]
        if exact.shape[0] > 0:
            labels = sorted_union(labels, exact, b_forced[t])
        rng = stream_seed(seed, STREAM_SAMPLE + serial * STREAM_SERIAL_STRIDE, s)
        ids = sc_ids[s]
        n_act = sc_n_act[s]
        acts = b_acts[s]
        finite, n_c, n_s = forward_into(params, spec, tables, sc, t, acts, ids, n_act, x_idx,
                                        x_val, labels, shared, rng, mark_stamp(serial, s),
                                        False)
        h = H[s]
        if not finite:
            losses[s] = np.nan
            n_act[last] = 0
            counts[s, 0] = 0
            counts[s, 1] = 0
            counts[s, 2] = 0
            h[:] = 0.0
            continue
        losses[s] = 0.0
        a_h = acts[a_off[last - 1]:a_off[last]]
        if spec.sparse[last - 1]:
            h[:] = 0.0
            for m in range(n_act[last - 1]):
                h[ids[s_off[last - 1] + m]] = a_h[m]
        else:
            for i in range(n_h):
                h[i] = a_h[i]
        n_x = _active_columns(ids[s_off[last]:s_off[last] + n_act[last]], n_c, n_s, shared,
                              b_col[s], b_extra[s], sc_forced[t], lazy)
        counts[s, 0] = n_c
        counts[s, 1] = n_s
        counts[s, 2] = n_x


@njit(cache=True, nogil=True, inline="always")
def _prefetch_first_extras(W, w_off, n_h, b_extra, counts, x_ptr, s, nb):
    """Before sample s: the output rows of sample s + 1's first extras, where its own loop
    computes them (no tasks, ``x_ptr``): that loop prefetches a sample's later extras as it
    goes, not its first ones. Samples come in chunks, so s + 1 is most often this thread's
    next."""
    if s + 1 < nb and x_ptr[s + 2] == x_ptr[s + 1]:
        for e in range(min(PREFETCH_AHEAD, counts[s + 1, 2])):
            prefetch_row(W, w_off + np.int64(b_extra[s + 1, e]) * n_h, n_h)


@njit(cache=True, nogil=True, inline="always")
def _active_columns(out, n_c, n_s, shared, col, extra, pos, lazy):
    """col[k] = the column in ``shared`` of the active id out[k] (-1: none), and the extras
    (the ids outside S, in position order) into ``extra``; returns their number. ``lazy``
    (a softmax loss): S minus C's columns are left unwritten where the set holds all of S,
    as its ids are (``sample.select_active``'s ``write_shared``): ``block_loss`` then takes
    the row pass, which reads C's columns only. ``out``: a
    sample's output active set [C | S minus C | fill]; ``pos``: the sorted positions in S of
    C's ids that ``sample._append_shared`` left there for this active set. C's ids come in
    ascending order (the sample's sorted labels; exact ids join them by a sorted union), so
    the ones in S take those positions in turn, each checked against S; an id that does not
    match is looked up (an extra, or an LSH candidate out of order: then the
    positions are collected again). The same columns as a lookup of every id, without a
    search per id of C."""
    n_x = 0
    n_in = 0
    cur = 0
    ns = shared.shape[0]
    looked_up = False
    last = -1
    for k in range(n_c):
        j = out[k]
        p = pos[n_in] if n_in < pos.shape[0] else -1
        # a match is a fact whatever ``pos`` holds (S's ids are distinct); ascending, so the
        # matched positions stay a sorted list for the runs below
        if last < p < ns and shared[p] == j:
            c = p
            last = p
            n_in += 1
        else:
            c, cur = seek_sorted(shared, j, cur)
            looked_up |= c >= 0
        col[k] = c
        if c < 0:
            extra[n_x] = j
            n_x += 1
    if looked_up:
        n_in = 0
        for k in range(n_c):
            if col[k] >= 0:
                pos[n_in] = col[k]
                n_in += 1
        sort_small(pos, n_in)
    # the random fill: outside S
    for k in range(n_s, out.shape[0]):
        col[k] = -1
        extra[n_x] = out[k]
        n_x += 1
    if lazy and out.shape[0] - n_x == ns:
        return n_x
    # S minus C comes in S's order: its columns are S's positions without C's, filled run by
    # run between C's sorted positions (no search, no per-id test)
    k = n_c
    lo = 0
    for q in range(n_in + 1):
        hi = pos[q] if q < n_in else shared.shape[0]
        m = min(hi - lo, n_s - k)
        for i in range(m):
            col[k + i] = lo + i
        k += m
        lo = hi + 1
    return n_x


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True, error_model="numpy")
def block_loss(params, spec, sc, blk, Y, rows, neg, Z, offs, xt, losses, scale, correct, each):
    """Step 4: per sample, the extras' logits (where the forward product's tasks did not
    compute them, ``xt.ptr``), the corrected softmax over S and the extras, its deltas back
    into Z (dZ) and the extras' into ``xt.d[s, :n_extra]``. ``offs[kind]``
    = S's biases plus each column's offset of that ``correction_kind``. A softmax sample
    whose active set holds all of S (always, unless its capacity cut S short) takes a
    vectorised row pass (``_softmax_row``, ``losses.each_row``); any other sample the
    per-sample path's ``sample.output_loss`` in that path's order."""
    nb = rows.shape[0]
    last = spec.n_layers - 1
    W, B = params.W, params.B
    w_off, b_off = spec.w_off[last], spec.b_off[last]
    s_lo = sc.s_off[last]
    use_corr = correct and spec.loss_code != LOSS_SIGMOID
    counts, b_col, b_extra, sc_ids, sc_n_act = blk.counts, blk.col, blk.extra, sc.ids, sc.n_act
    zbuf, b_forced = blk.zbuf, blk.forced
    Yp, Yi = Y.ptr, Y.ind
    H, d_store, x_ptr = xt.H, xt.d, xt.ptr
    ns = Z.shape[1]
    n_h = H.shape[1]
    for s in prange(nb):
        if not math.isfinite(losses[s]):
            continue
        t = numba.get_thread_id()
        _prefetch_first_extras(W, w_off, n_h, b_extra, counts, x_ptr, s, nb)
        n = sc_n_act[s, last]
        n_c, n_s, n_x = counts[s, 0], counts[s, 1], counts[s, 2]
        out = sc_ids[s, s_lo:s_lo + n]
        labels = Yi[Yp[rows[s]]:Yp[rows[s] + 1]]
        ranges, kind = correction_kind(spec, n, n_c, n_s, neg, use_corr)
        if spec.loss_code != LOSS_SIGMOID and n - n_x == ns:
            if x_ptr[s + 1] > x_ptr[s]:
                fill_offsets(d_store[s, :n_x], n - n_s, ranges.log_w2)
            else:
                extras_logits(W, B, w_off, b_off, H[s], b_extra[s, :n_x], n - n_s,
                              ranges.log_w2, d_store[s])
            args = (Z[s], offs[kind], offs[0], ranges.log_w1, b_col[s], out, n_c, d_store[s, :n_x],
                    labels, scale, zbuf[t])
            if each is not None:
                losses[s] = each_row(*args)
            else:
                losses[s] = _softmax_row(*args, b_forced[t])
        else:
            losses[s] = _loss_by_positions(params, w_off, b_off, H[s], Z[s], offs[0], out,
                                           b_col[s], labels, spec.loss_code, scale,
                                           (ranges, corr_array(neg, kind)), zbuf[t],
                                           d_store[s], each)


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def _loss_by_positions(params, w_off, b_off, h, zs, bS, out, col, labels, loss_code, scale,
                       corrections, z, d, each):
    """One sample's loss in the per-sample path's order (``sample.output_loss`` over its
    active positions ``out``; ``each``: its argument): the sigmoid loss, and a softmax whose
    active set lost part of S to its capacity (S's other columns get a zero delta)."""
    W, B = params.W, params.B
    n = out.shape[0]
    ranges, corr = corrections
    for k in range(n):
        c = col[k]
        z[k] = zs[c] + bS[c] if c >= 0 else row_logit(W, B, w_off, b_off, out[k], h)
    loss = output_loss(z, n, False, out, labels, loss_code, scale, z, ranges, corr, each)
    zs[:] = 0.0
    n_x = 0
    for k in range(n):
        c = col[k]
        if c >= 0:
            zs[c] = z[k]
        else:
            d[n_x] = z[k]
            n_x += 1
    return loss


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def _softmax_row(zs, off, bS, log_w1, col, out, n_c, dx, labels, scale, saved, slots):
    """The corrected softmax of one sample whose active set holds all of S: ``zs`` (its row
    of H W_S^T) and ``dx`` (its extras' corrected logits) become its deltas, scale * (p - y);
    returns its loss.

    S's columns get ``off`` (bias + the column's offset) and ``log_w1``, except those in C
    (the sample's labels and LSH ids: computed exactly, logit + bias, kept aside in ``saved``
    meanwhile); then one shift, one exp pass over the row (``expsum``: vectorised) and one
    scaling pass, where the per-sample path walks the active positions with a libm exp. The
    labels' places (a column, or an extra) are kept in the int scratch ``slots`` (room for
    the sample's labels: ``blk.forced[t]``) on the first walk over C, so that y's pass visits
    the labels alone."""
    ny = labels.shape[0]
    if ny == 0:
        # no target distribution: the sample contributes nothing
        zs[:] = 0.0
        dx[:] = 0.0
        return 0.0
    offset_row(zs, off, bS, log_w1, col, n_c, saved)
    # the labels are in C: their corrected logit is the exact one
    lz = 0.0
    n_found = 0
    e = 0
    cur = 0
    for k in range(n_c):
        c = col[k]
        if c >= 0:
            v = saved[k]
            zs[c] = v
        else:
            v = dx[e]
            e += 1
        p, cur = seek_sorted(labels, out[k], cur)
        if p >= 0:
            lz += v
            # where its delta goes: its column, or -(1 + its place among the extras)
            slots[n_found] = c if c >= 0 else -e
            n_found += 1
    zmax, finite = max_and_finite(zs)
    xmax, xbad = max_or_nan(dx)
    zmax = max(zmax, xmax)
    if not finite or xbad or not math.isfinite(zmax):
        # overflowed logits (a diverging run): report NaN, the engine stops before updating
        zs[:] = 0.0
        dx[:] = 0.0
        return np.nan
    ssum = exp_shifted_inplace(zs, zmax)
    for i in range(dx.shape[0]):
        v = math.exp(np.float64(dx[i]) - zmax)      # a dropped fill (-inf) gets 0
        dx[i] = v
        ssum += v
    f = np.float32(scale / ssum)
    for c in range(zs.shape[0]):
        zs[c] *= f
    for i in range(dx.shape[0]):
        dx[i] *= f
    wl = np.float32(scale / ny)
    for q in range(n_found):
        c = slots[q]
        if c >= 0:
            zs[c] -= wl
        else:
            dx[-1 - c] -= wl
    w = 1.0 / ny
    return -w * (lz - n_found * zmax) + w * n_found * math.log(ssum)


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True, error_model="numpy")
def block_backward(params, spec, sc, blk, X, rows, dH, xt, first_weights):
    """Step 6: per sample, the extras' share of dH (the backward product's task parts where
    it had tasks, ``xt.ptr``), the ReLU mask, and the back-propagation
    through the hidden layers (gradients into GW/GB without locks; the first layer's weight
    gradient only with ``first_weights``, else the update forms it from ``blk.dels``)."""
    nb = rows.shape[0]
    last = spec.n_layers - 1
    W = params.W
    w_off = spec.w_off[last]
    n_h = spec.n_in[last]
    a_off, s_off = sc.a_off, sc.s_off
    b_acts, b_dels, b_extra, counts, sc_ids, sc_n_act = (blk.acts, blk.dels, blk.extra,
                                                         blk.counts, sc.ids, sc.n_act)
    Xp, Xi, Xd = X.ptr, X.ind, X.dat
    d_store, x_ptr, x_part = xt.d, xt.ptr, xt.part
    for s in prange(nb):
        _prefetch_first_extras(W, w_off, n_h, b_extra, counts, x_ptr, s, nb)
        r = rows[s]
        g = dH[s]
        d = d_store[s]
        extra = b_extra[s]
        if x_ptr[s + 1] == x_ptr[s]:
            add_delta_rows(W, w_off, extra, d, 0, counts[s, 2], g)
        for p in range(x_ptr[s], x_ptr[s + 1]):
            for i in range(n_h):
                g[i] += x_part[p, i]
        ids = sc_ids[s]
        n_act = sc_n_act[s]
        acts = b_acts[s]
        dels = b_dels[s]
        a_h = acts[a_off[last - 1]:a_off[last]]
        d_h = dels[a_off[last - 1]:a_off[last]]
        if spec.sparse[last - 1]:
            for m in range(n_act[last - 1]):
                d_h[m] = g[ids[s_off[last - 1] + m]] if a_h[m] > 0.0 else 0.0
        else:
            for i in range(n_h):
                d_h[i] = g[i] if a_h[i] > 0.0 else 0.0
        backward_from(params, spec, a_off, s_off, acts, dels, ids, n_act,
                      Xi[Xp[r]:Xp[r + 1]], Xd[Xp[r]:Xp[r + 1]], last - 1,
                      True, first_weights)


@njit(cache=True, nogil=True)
def block_offsets(bS, shared, neg):
    """[3, |S|] float32: the biases of S's columns plus each ``correction_kind``'s offset
    (CORR_NONE: none; CORR_PLAIN: ``neg.corr``; CORR_MIX: ``neg.corr_mix``), the same for
    every sample of the batch (``block_loss``)."""
    offs = np.empty((3, shared.shape[0]), np.float32)
    corr = neg.corr.shape[0] > 0
    for i in range(shared.shape[0]):
        b = bS[i]
        offs[CORR_NONE, i] = b
        offs[CORR_PLAIN, i] = b + neg.corr[shared[i]] if corr else b
        offs[CORR_MIX, i] = b + neg.corr_mix[shared[i]] if corr else b
    return offs


def _draw(net, seed, serial, n_threads=None):
    """The batch's shared negatives. A frequency draw comes from the draws made ahead for the
    next batches, one batch a thread (``SharedNegatives.draw_ahead``): each call's Python
    (numpy's generator and sort for every batch, the kernel's dispatch) runs on caches the
    batches' kernels swept, so at least ``DRAWS_AHEAD`` batches are drawn at a time."""
    neg = net.negatives
    if neg.power > 0 and neg.n_shared > 0:
        n_threads = numba.get_num_threads() if n_threads is None else n_threads
        return neg.draw_ahead(seed, serial, max(DRAWS_AHEAD, n_threads))
    return neg.draw(seed, serial)


DRAWS_AHEAD = 16


# chunks each thread should find in a per-sample loop (``chunk_size``): on debcontents one
# row in a hundred has 500+ labels, one in a thousand 2,700+, and a thread that drew one
# must not hold the others
CHUNKS_PER_THREAD = 8


def chunk_size(nb, n_threads):
    """Samples a thread takes at a time from a per-sample loop of ``nb`` over ``n_threads``
    threads: CHUNK, fewer where a thread would find fewer than CHUNKS_PER_THREAD chunks."""
    return max(1, min(CHUNK, int(nb) // (CHUNKS_PER_THREAD * int(n_threads))))


# block_forward's ``frows`` when the first layer is not fused: nothing to list
NO_FEATURE_ROWS = make_feature_rows(0, 1, 1, 1)


def feature_rows(work, layout, X, rows):
    """The ``FeatureRows`` of ``work`` (a worker, or the network as its own), grown (doubled)
    when batch ``rows`` has more input values than it holds."""
    n_e = int(batch_entries(X.indptr, rows))
    frows = work.feature_rows
    if frows is None or frows.ent_p.shape[0] < n_e:
        cap = max(n_e, 2 * (frows.ent_p.shape[0] if frows is not None else 0))
        frows = make_feature_rows(layout.sizes[0], layout.n_out[0], cap,
                                  numba.config.NUMBA_NUM_THREADS)
        work.feature_rows = frows
    return frows
