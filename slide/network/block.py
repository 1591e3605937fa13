"""The batched engine: a sampled output layer's shared block through BLAS.

Every sample of a batch has the batch's shared negatives S in its output active set (the
frequency draw of ``slide.kernels.negatives``). The per-sample path (``slide.network.batch``)
scores them sample by sample in scalar loops; here they are three dense products for the
whole batch, and only what differs between samples -- its true labels and LSH ids outside S,
its random fill -- goes through per-sample loops:

    1. per sample (HOGWILD threads):  hidden layers forward; the output active set selected
       exactly as the per-sample path selects it (``sample.select_active``), each active id
       mapped to its column in S or to the sample's "extras"; H[s] = last hidden layer
    2. W_S, b_S = the rows of S (a gather)
    3. Z = H @ W_S.T                                                      GEMM  [B, |S|]
    4. per sample: logits of the extras (dot products), the corrected softmax of
       ``sample.output_loss`` over S + extras in the per-sample path's order; its deltas
       go back into Z (dZ, in place) and, for the extras, into the row path's store
    5. dH = dZ @ W_S                                                       GEMM  [B, h]
       dW_S = dZ.T @ H,  db_S = column sums of dZ                          GEMM  [|S|, h]
    6. per sample: dH[s] += the extras' rows times their deltas; back-propagate into the
       hidden layers (``sample.backward_from``, gradients added without locks)
    7. optimizer: hidden layers' touched rows; the extras' rows by the row path
       (``optim.output_step``); S's rows from dW_S in one pass (``optim.block_step``)

The active sets, the correction and the loss are the per-sample path's own functions, so both
paths optimise the same objective; they differ only in the order of float32 sums
(tests/test_block.py compares them). Samples are dealt to threads dynamically (a chunk of a
few samples at a time), so a core that is busy with another job does not hold the batch.
"""
import math
import time

import numba
import numpy as np
from numba import njit, prange

from slide.data.inputs import take_rows
from slide.kernels.arrays import csr
from slide.kernels.layers import FASTMATH
from slide.kernels.negatives import correction, find_sorted
from slide.kernels.rng import STREAM_SAMPLE, STREAM_SERIAL_STRIDE, stream_seed
from slide.kernels.sample import backward_from, forward_into, output_loss
from slide.kernels.touched import output_entries


# samples a thread takes at a time (dynamic scheduling of the per-sample loops)
CHUNK = 4


@njit(cache=True, nogil=True)
def _sorted_union(a, b, buf):
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


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True, error_model="numpy")
def block_forward(params, spec, tables, sc, blk, X, Y, rows, seed, serial, shared, exact, H,
                  losses):
    """Step 1 for every sample of ``rows``: hidden layers into ``blk.acts[s]``, the output
    active set into ``sc.ids[s]`` / ``sc.n_act[s]`` (layout [C | S minus C | fill], see
    ``sample.select_active``; ``exact``, sorted ids every sample computes exactly, join its
    labels in C), ``blk.col[s, k]`` = column in ``shared`` of active id k (-1:
    an extra), ``blk.extra[s, :n]`` the extras' ids, ``blk.counts[s]`` = (n_c, n_s, n_extra),
    H[s] = the output layer's input. A sample whose hidden layers are non-finite gets loss
    NaN (the caller then applies nothing)."""
    nb = rows.shape[0]
    last = spec.n_layers - 1
    a_off, s_off = sc.a_off, sc.s_off
    n_h = spec.n_in[last]
    # bundle members out before the prange: Numba's parfor lowering drops stores made through
    # a tuple attribute inside the loop (see slide.network.optim.output_step)
    b_acts, b_col, b_extra, counts, sc_ids, sc_n_act = (blk.acts, blk.col, blk.extra,
                                                         blk.counts, sc.ids, sc.n_act)
    b_forced = blk.forced
    for s in prange(nb):
        t = numba.get_thread_id()
        r = rows[s]
        x_idx = X.ind[X.ptr[r]:X.ptr[r + 1]]
        x_val = X.dat[X.ptr[r]:X.ptr[r + 1]]
        labels = Y.ind[Y.ptr[r]:Y.ptr[r + 1]]
        if exact.shape[0] > 0:
            labels = _sorted_union(labels, exact, b_forced[t])
        rng = stream_seed(seed, STREAM_SAMPLE + serial * STREAM_SERIAL_STRIDE, s)
        ids = sc_ids[s]
        n_act = sc_n_act[s]
        acts = b_acts[s]
        finite, n_c, n_s = forward_into(params, spec, tables, sc, t, acts, ids, n_act, x_idx,
                                        x_val, labels, shared, rng, serial * 1048576 + s + 1,
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
        out = ids[s_off[last]:s_off[last + 1]]
        col = b_col[s]
        extra = b_extra[s]
        n_x = 0
        p = 0
        for k in range(n_act[last]):
            j = out[k]
            if n_c <= k < n_s:
                # S minus C comes in S's (sorted) order: walk S instead of searching it
                while shared[p] != j:
                    p += 1
                c = p
            elif k < n_c:
                c = find_sorted(shared, j)
            else:
                c = -1
            col[k] = c
            if c < 0:
                extra[n_x] = j
                n_x += 1
        counts[s, 0] = n_c
        counts[s, 1] = n_s
        counts[s, 2] = n_x


@njit(cache=True, nogil=True, parallel=True)
def gather_rows(W, B, w_off, b_off, n_in, shared, WS, bS):
    """WS[i] = the output layer's row shared[i], bS[i] its bias."""
    for i in prange(shared.shape[0]):
        o = w_off + np.int64(shared[i]) * n_in
        WS[i, :] = W[o:o + n_in]
        bS[i] = B[b_off + shared[i]]


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True, error_model="numpy")
def block_loss(params, spec, sc, blk, Y, rows, neg, Z, bS, H, d_store, losses, scale, correct):
    """Step 4: per sample, the extras' logits, the per-sample path's corrected loss over S and
    the extras (``sample.output_loss``, in the same order), the deltas back into Z (dZ) and
    the extras' into ``d_store[s, :n_extra]``."""
    nb = rows.shape[0]
    last = spec.n_layers - 1
    W, B = params.W, params.B
    w_off, b_off = spec.w_off[last], spec.b_off[last]
    n_h = spec.n_in[last]
    s_lo = sc.s_off[last]
    use_corr = correct and spec.loss_code == 0
    zbuf, b_col, counts, sc_ids, sc_n_act = blk.zbuf, blk.col, blk.counts, sc.ids, sc.n_act
    Yp, Yi = Y.ptr, Y.ind
    for s in prange(nb):
        if not math.isfinite(losses[s]):
            continue
        t = numba.get_thread_id()
        z = zbuf[t]
        n = sc_n_act[s, last]
        col = b_col[s]
        out = sc_ids[s, s_lo:s_lo + n]
        h = H[s]
        zs = Z[s]
        for k in range(n):
            c = col[k]
            if c >= 0:
                z[k] = zs[c] + bS[c]
            else:
                o = w_off + np.int64(out[k]) * n_h
                acc = B[b_off + out[k]]
                for i in range(n_h):
                    acc += W[o + i] * h[i]
                z[k] = acc
        labels = Yi[Yp[rows[s]]:Yp[rows[s] + 1]]
        ranges, corr = correction(spec, n, counts[s, 0], counts[s, 1], neg, use_corr)
        losses[s] = output_loss(z, n, False, out, labels, spec.loss_code, scale, z, ranges,
                                corr)
        n_x = 0
        d = d_store[s]
        for k in range(n):
            c = col[k]
            if c >= 0:
                zs[c] = z[k]
            else:
                d[n_x] = z[k]
                n_x += 1


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True, error_model="numpy")
def block_backward(params, spec, sc, blk, X, rows, dH, d_store):
    """Step 6: per sample, the extras' share of dH, the ReLU mask, and the back-propagation
    through the hidden layers (gradients into GW/GB without locks)."""
    nb = rows.shape[0]
    last = spec.n_layers - 1
    W = params.W
    w_off = spec.w_off[last]
    n_h = spec.n_in[last]
    a_off, s_off = sc.a_off, sc.s_off
    b_acts, b_dels, b_extra, counts, sc_ids, sc_n_act = (blk.acts, blk.dels, blk.extra,
                                                          blk.counts, sc.ids, sc.n_act)
    Xp, Xi, Xd = X.ptr, X.ind, X.dat
    for s in prange(nb):
        r = rows[s]
        g = dH[s]
        d = d_store[s]
        extra = b_extra[s]
        for e in range(counts[s, 2]):
            o = w_off + np.int64(extra[e]) * n_h
            de = d[e]
            for i in range(n_h):
                g[i] += de * W[o + i]
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
                      True)


def _parallel_chunks():
    """Dynamic scheduling for the per-sample loops (a busy core takes fewer chunks)."""
    return numba.parallel_chunksize(CHUNK)


def forward_backward(net, X, Y, rows, seed, serial):
    """Steps 1-6 of one batch: per-sample losses (NaN for a sample that could not be
    computed: then nothing else is done), gradients of the hidden layers in GW/GB, S's
    gradient in ``net.block.dWS``/``dbS`` and the extras' deltas in ``net.store``."""
    nb = rows.shape[0]
    n_threads = numba.get_num_threads()
    if net.sc.codes.shape[0] < n_threads:
        # the per-thread scratch rows are indexed by numba.get_thread_id()
        batch_size, _, max_labels = net._scratch_key
        net.prepare(batch_size, n_threads, max_labels)
    sc, blk = net.sc, net.block
    drawn = net.negatives.draw(seed, serial)
    neg = net.negatives.bundle(drawn)
    exact = drawn[:0]
    shared = drawn
    if net.oracle_m > 0:
        chooser = net.block_chooser if net.block_chooser is not None else _oracle_ids
        exact = chooser(net, X, rows)
        shared = np.union1d(drawn, exact).astype(np.int32)
    ns = shared.shape[0]
    lay = net.layout
    last = lay.n_layers - 1
    H = net.store.h_store[:nb]
    losses = net.losses[:nb]
    Xc, Yc = csr(X), csr(Y)
    with _parallel_chunks():
        block_forward(net.params, net.spec, net.tables, sc, blk, Xc, Yc, rows, np.uint64(seed),
                      np.int64(serial), shared, exact, H, losses)
    if not np.isfinite(losses).all():
        return losses
    WS, bS = blk.WS[:ns], blk.bS[:ns]
    gather_rows(net.W, net.B, int(lay.w_off[last]), int(lay.b_off[last]), int(lay.n_in[last]),
                shared, WS, bS)
    # a C-contiguous [nb, ns] view of the buffer whatever ns (a [:nb, :ns] slice is
    # non-contiguous when ns is below the buffer's width: a second compiled block_loss)
    Z = blk.Z.reshape(-1)[:nb * ns].reshape(nb, ns)
    with np.errstate(over="ignore", invalid="ignore"):
        # a diverging run overflows here; the loss below reports it (DivergenceError)
        np.matmul(H, WS.T, out=Z)
    d_store = net.store.d_store[:nb]
    with _parallel_chunks():
        block_loss(net.params, net.spec, sc, blk, Yc, rows, neg, Z, bS, H, d_store, losses,
                   np.float32(1.0 / nb), net.correct)
    if not np.isfinite(losses).all():
        return losses
    dH = blk.dH[:nb]
    np.matmul(Z, WS, out=dH)
    np.matmul(Z.T, H, out=blk.dWS[:ns])
    np.sum(Z, axis=0, out=blk.dbS[:ns])
    with _parallel_chunks():
        block_backward(net.params, net.spec, sc, blk, Xc, rows, dH, d_store)
    net.block_shared = shared
    return losses


def _oracle_ids(net, X, rows):
    """The study hook's exact ids: the union of every sample's top ``oracle_per_sample``
    logits over ALL labels under the current weights (dense products, not counted as
    training: their seconds go to ``net.oracle_seconds``), at most ``oracle_m`` of them."""
    t0 = time.perf_counter()
    Wo, bo = net.output_view()
    Hx = net.hidden(take_rows(X, rows))
    Z = Hx @ Wo.T + bo
    t = int(net.oracle_per_sample)
    top = np.argpartition(-Z, t - 1, axis=1)[:, :t]
    ids = np.unique(top).astype(np.int32)
    if ids.shape[0] > net.oracle_m:
        # keep the ids with the highest logit anywhere in the batch
        best = Z[:, ids].max(axis=0)
        ids = np.sort(ids[np.argsort(-best)[:net.oracle_m]]).astype(np.int32)
    net.oracle_seconds += time.perf_counter() - t0
    return ids


def update(net, X, rows, serial, optimizer):
    """Step 7: the optimizer on every row the batch touched."""
    nb = rows.shape[0]
    blk = net.block
    nr, nbias = net.touched(X, rows, serial)
    optimizer.step(net.params, net.touched_rows, nr, nbias)
    nu = output_entries(blk.extra[:nb], blk.counts[:nb, 2:3], 0, net.store.d_store.shape[1],
                        net.out_rows, np.int64(serial))
    optimizer.step_output(net.W, net.B, net.out_rows, nu, net.store)
    shared = net.block_shared
    ns = shared.shape[0]
    optimizer.step_block(net.W, net.B, shared, blk.dWS[:ns], blk.dbS[:ns], net.out_stamp,
                         serial)
