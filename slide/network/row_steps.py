"""Row steps that form each row's gradient as they update it, race-free and in a fixed order:
the sampled output layer's rows from the per-sample deltas, the batched engine's shared block
from its GEMM gradient and its first layer from the per-sample first-layer deltas, all three
in one parallel loop (``batch_row_steps``; ``first_layer_step``: the first layer's alone). The
update itself is ``slide.network.adam``'s; ``slide.network.optim.SparseOptimizer`` calls
these.
"""
import numba
import numpy as np
from numba import prange

from slide.kernels.atomic import claim_step
from slide.kernels.jit import njit
from slide.kernels.layers import FASTMATH
from slide.kernels.prefetch import prefetch_line, prefetch_row
from slide.network.adam import (KIND_ADAM, _adam_row, _adam_row_scaled, _apply_missed,
                                _catch_up, _consts, _missed_steps)


@njit(cache=True, nogil=True, inline="always")
def _prefetch_adam_row(W, MW, VW, start, n):
    """Prefetch a row of W and of both moments (a row step's next row: the rows are scattered,
    ``slide.kernels.prefetch``)."""
    prefetch_row(W, start, n)
    prefetch_row(MW, start, n)
    prefetch_row(VW, start, n)


@njit(cache=True, nogil=True, inline="always")
def _prefetch_output_row(W, B, MW, VW, MB, VB, TW, TB, start, n, e, j):
    """Prefetch an output row's weights and moments and its scalars: its bias and the bias's
    moments (``B[e]``...) and both step records (``TW[j]``, ``TB[j]``), each a cache miss of
    its own in per-neuron arrays of MBs."""
    _prefetch_adam_row(W, MW, VW, start, n)
    prefetch_line(B, e)
    if MB.shape[0] > 0:
        prefetch_line(MB, e)
        prefetch_line(VB, e)
    if TW.shape[0] > 0:
        prefetch_line(TW, j)
        prefetch_line(TB, j)


@njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def _row_gradient(u, out_rows, store, g):
    """g = gradient of unique output row u: the sum over its (sample s, slot k) entries of
    d_store[s, k] * h_store[s], in entry order. Returns the bias gradient."""
    d_cap = store.d_store.shape[1]
    n_in = store.h_store.shape[1]
    for i in range(n_in):
        g[i] = 0.0
    gb = np.float32(0.0)
    for e in range(out_rows.row_ptr[u], out_rows.row_ptr[u + 1]):
        p = out_rows.ent[e]
        s = p // d_cap
        d = store.d_store[s, p - s * d_cap]
        gb += d
        h = store.h_store[s]
        for i in range(n_in):
            g[i] += d * h[i]
    return gb


@njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def _output_row_step(W, B, MW, VW, MB, VB, TW, TB, base, e, j, g, gb, hyper, kind):
    """One output neuron's update from its gradient: row ``W[base:base+len(g)]`` gets ``g``,
    bias ``B[e]`` gets ``gb[0]``; Adam (after the missed steps, when the layer's step records
    ``TW``/``TB`` are not empty) or SGD at the step ``hyper`` describes. (Inlined into the
    row loops: the constants derived from ``hyper`` here are hoisted out of them.)"""
    k = _consts(hyper)
    lr = np.float32(hyper.lr_t)
    t = hyper.t
    n_in = g.shape[0]
    w = W[base:base + n_in]
    if kind == KIND_ADAM:
        mw = MW[base:base + n_in]
        vw = VW[base:base + n_in]
        if TW.shape[0] > 0:
            # both records claimed here, each atomically (a batch in flight beside this one
            # may touch the row); they agree unless such a batch came between, so one closed
            # form usually serves both (its scalar chain is a noticeable part of a row's step)
            last = claim_step(TW, j, t)
            last_b = claim_step(TB, j, t)
            missed = _missed_steps(last, t, hyper)
            _apply_missed(w, mw, vw, missed, hyper)
            if last_b != last:
                missed = _missed_steps(last_b, t, hyper)
            _apply_missed(B[e:e + 1], MB[e:e + 1], VB[e:e + 1], missed, hyper)
        _adam_row(w, mw, vw, g, k, True)
        _adam_row(B[e:e + 1], MB[e:e + 1], VB[e:e + 1], gb, k, False)
    else:
        for i in range(n_in):
            w[i] -= lr * g[i]
        B[e] -= lr * gb[0]


@njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def _first_row(W, MW, VW, TW, hyper, kind, w_off, frows, g_buf, n_uniq, x_val, dels, u):
    """Row u of the first layer's fused step (``first_layer_step``): its gradient from the
    feature's entries and its update (the next row prefetched); ``g_buf``: per-thread
    scratch rows (``frows.g``, passed apart: the caller takes bundle members out of a parallel
    loop's body)."""
    uniq, row_ptr, ent_p, ent_s = frows.uniq, frows.row_ptr, frows.ent_p, frows.ent_s
    n_h = dels.shape[1]
    k = _consts(hyper)
    if u + 1 < n_uniq:
        fn = uniq[u + 1]
        _prefetch_adam_row(W, MW, VW, w_off + np.int64(fn) * n_h, n_h)
        if TW.shape[0] > 0:
            prefetch_line(TW, fn)
    f = uniq[u]
    base = w_off + np.int64(f) * n_h
    w = W[base:base + n_h]
    e0, e1 = row_ptr[u], row_ptr[u + 1]
    if kind == KIND_ADAM:
        mw, vw = MW[base:base + n_h], VW[base:base + n_h]
        if TW.shape[0] > 0:
            _catch_up(w, mw, vw, claim_step(TW, f, hyper.t), hyper.t, hyper)
        if e1 - e0 == 1:
            # one entry (most rows): the gradient is x_value * delta, formed as read
            _adam_row_scaled(w, mw, vw, x_val[ent_p[e0]], dels[ent_s[e0]], k)
            return
    g = g_buf[numba.get_thread_id()]
    g[:] = 0.0
    for e in range(e0, e1):
        xv = x_val[ent_p[e]]
        d = dels[ent_s[e]]
        for i in range(n_h):
            g[i] += xv * d[i]
    if kind == KIND_ADAM:
        _adam_row(w, MW[base:base + n_h], VW[base:base + n_h], g, k, False)
    else:
        lr = np.float32(hyper.lr_t)
        for i in range(n_h):
            w[i] -= lr * g[i]


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True, error_model="numpy")
def first_layer_step(W, MW, VW, TW, hyper, kind, w_off, frows, n_uniq, x_val, dels):
    """The batched engine's first layer, gradient and update fused: row f (the weights of
    input feature f, ``W[w_off + f * h : + h]``) gets g = sum over the batch's entries of
    feature f of x_value * that sample's first-layer delta (``dels[s]``), in sample order
    (``frows``: ``slide.kernels.touched.feature_entries``), then Adam (after the missed steps
    when ``TW`` -- the layer's step records -- is not empty) or SGD. No gradient buffer is
    read or written: the per-sample backward leaves these rows alone, where racy adds into
    GW and a second pass to apply and zero them cost twice the bytes."""
    g_buf = frows.g
    for u in prange(n_uniq):
        _first_row(W, MW, VW, TW, hyper, kind, w_off, frows, g_buf, n_uniq, x_val, dels, u)


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True, error_model="numpy")
def batch_row_steps(W, B, mom, hyper, kind, w_off, b_off, frows, first, out_rows, n2, store,
                    block):
    """The row steps as one parallel loop (the batched engine's three: one fork and join
    instead of three, and a thread that finishes one kind of row takes the next kind's):

    - the first layer's rows, ``frows`` and ``first`` = (n_uniq, x_val, dels, its w_off, its
      step records), as ``first_layer_step``;
    - the sampled output layer's row-path rows (the per-sample engine's active rows, the
      batched engine's extras), ``n2`` of them: row j's gradient is formed here, race-free and
      in a fixed order, from the per-sample deltas the batch kernel stored (``store``:
      h_store[s] = the layer's input for sample s, d_store its deltas; ``out_rows``: the
      per-row entry lists of ``slide.kernels.touched``), and applied at once, so the output
      layer needs no gradient buffer at all (343 MB saved at Amazon-670K) and each touched
      row is read and written once a batch; gradient scratch ``out_rows.g_out[thread]``;
    - the shared block's rows, ``block`` = (rows, dW, db, stamp, serial): row rows[i] from
      its batch gradient dW[i] / db[i]; ``stamp[j] = serial`` records the update for the
      incremental rehash.

    ``mom``, ``w_off``, ``b_off``: the output layer's; Adam (kind KIND_ADAM; non-empty step
    records: the missed zero-gradient steps first) or SGD with step hyper.lr_t. The three
    sets of rows are disjoint (the first layer's; the extras lie outside S), so each row gets
    exactly the operations of its own step, in any order and any split: the same bits. Rows
    are dealt in chunks (``optim.row_chunk``): the rows every sample shares come first in
    ``out_rows.uniq`` and an equal range a thread would leave one thread all of them. (The
    named tuples the loop reads are arguments of their own: Numba's parfor lowering cannot
    rebuild one taken out of a tuple; the arrays it writes are taken out of theirs before the
    loop, as it drops a store written through a tuple attribute inside it.)"""
    MW, VW, MB, VB, TW, TB = mom
    n1, x_val, dels, w_off1, TW1 = first
    g1 = frows.g
    uniq2, g_out = out_rows.uniq, out_rows.g_out
    rows3, dW, db, stamp, serial = block
    n3 = rows3.shape[0]
    n_e = store.h_store.shape[1]
    n_b = dW.shape[1]
    for task in prange(n1 + n2 + n3):
        if task < n1:
            _first_row(W, MW, VW, TW1, hyper, kind, w_off1, frows, g1, n1, x_val, dels, task)
            continue
        # an output row: an extra's gradient formed from its entries, or a block row's from
        # dW; one call site of the update for both (inlined once: half the compile time)
        extra = task < n1 + n2
        if extra:
            r, n_r, ids, n_in = task - n1, n2, uniq2, n_e
        else:
            r, n_r, ids, n_in = task - n1 - n2, n3, rows3, n_b
        j = ids[r]
        if r + 1 < n_r:
            jn = ids[r + 1]
            _prefetch_output_row(W, B, MW, VW, MB, VB, TW, TB, w_off + np.int64(jn) * n_in, n_in,
                                 b_off + jn, jn)
        if extra:
            g = g_out[numba.get_thread_id()]
            g[n_in] = _row_gradient(r, out_rows, store, g)
            grad, grad_b = g[:n_in], g[n_in:n_in + 1]
        else:
            stamp[j] = serial
            grad, grad_b = dW[r], db[r:r + 1]
        _output_row_step(W, B, MW, VW, MB, VB, TW, TB, w_off + np.int64(j) * n_in, b_off + j, j,
                         grad, grad_b, hyper, kind)
