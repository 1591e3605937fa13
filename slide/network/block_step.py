"""The batched engine's batch as one compiled call: ``slide.network.block``'s steps 1-7, the
same kernels in the same order with the same arguments, called from a Numba function instead
of from Python.

Run from Python, a batch made a dozen kernel calls with Python between them: each call
fingerprints and unboxes its bundles of arrays (8.6 us warm, 22 us after the previous kernel
swept the caches, at the 200k-label shape), the Python between them (views, bundles, the
offsets of S's columns, finiteness checks, chunk-size contexts) ran on those swept caches
(0.20-0.26 ms a batch at 200k labels against 0.08 on a set that fits in the caches), and
TBB's workers, asleep after those gaps, took 8 us instead of 1.5 to wake at each loop
(``bench/probes/probe_batch_overheads.py``, ``bench/results/batch_overheads_*.log``). Here
Python draws the negatives (numpy's generator), sizes the buffers and advances the
optimizer's step count, then makes one call. The results are the same bits: the golden
fixtures did not move.

``applies(net)`` says which networks take it (the batched engine with a dense first layer
and no oracle block, the defaults); the others keep ``slide.network.block``'s Python
sequence, which stays the reference the probes time phase by phase.
"""
import numba
import numpy as np
from numba import njit

from slide.kernels.arrays import Extras, csr
from slide.kernels.threads import set_chunk_size
from slide.kernels.touched import collect_touched, output_entries
from slide.network import block as _block
from slide.network.adam import touched_step
from slide.network.extras import extras_tasks
from slide.network import extras as _extras
from slide.network.optim import row_chunk_sizes, rows_a_chunk
from slide.network.block import (block_backward, block_forward, block_loss, block_offsets,
                                 split_backward_products, split_forward_product)
from slide.network.row_steps import batch_row_steps


def applies(net):
    """Whether ``net``'s batches take the compiled step: the batched engine with a dense
    first layer (fused into the row steps: ``fused_first`` implies ``batched``) and no oracle
    or chosen block."""
    return net.fused_first and net.oracle_m == 0


@njit(cache=True, nogil=True)
def all_finite(a):
    """Whether every entry of the 1-D array ``a`` is finite."""
    for i in range(a.shape[0]):
        if not np.isfinite(a[i]):
            return False
    return True


@njit(cache=True, nogil=True)
def _forward_backward(net, data, draw, sched):
    """``block.forward_backward``'s kernels (steps 1-6) for the batch ``data`` = (X, Y, rows)
    with the negatives ``draw`` = (seed, serial, shared, neg, frows, correct, each); ``net``
    = (params, spec, tables, sc, blk, store, losses); ``sched`` = (per-sample chunk, BLAS
    parts, extras a task, ``optim.row_chunk_sizes()``, threads). False as soon as a sample's
    loss is not finite (nothing is applied then)."""
    params, spec, tables, sc, blk, store, all_losses = net
    Xc, Yc, rows = data
    seed, serial, shared, neg, frows, correct, each = draw
    chunk, n_parts, extras_task = sched[0], sched[1], sched[2]
    nb = rows.shape[0]
    H, losses, d_store = store.h_store[:nb], all_losses[:nb], store.d_store[:nb]
    set_chunk_size(chunk)
    block_forward(params, spec, tables, sc, blk, Xc, Yc, rows, seed, serial, shared, shared[:0],
                  H, losses, frows)
    if not all_finite(losses):
        return False
    ns = shared.shape[0]
    WS, bS = blk.WS[:ns], blk.bS[:ns]
    Z = blk.Z.reshape(-1)[:nb * ns].reshape(nb, ns)
    last = spec.n_layers - 1
    tasks, ptr = extras_tasks(blk.counts, nb, extras_task)
    xt = Extras(params.W, params.B, np.int64(spec.w_off[last]), np.int64(spec.b_off[last]),
                blk.extra[:nb], H, d_store, tasks, ptr,
                np.empty((tasks.shape[0], H.shape[1]), np.float32))
    set_chunk_size(1)
    split_forward_product(xt, shared, WS, bS, Z, n_parts)
    offs = block_offsets(bS, shared, neg)
    set_chunk_size(chunk)
    block_loss(params, spec, sc, blk, Yc, rows, neg, Z, offs, xt, losses, np.float32(1.0 / nb),
               correct, each)
    if not all_finite(losses):
        return False
    dH = blk.dH[:nb]
    set_chunk_size(1)
    split_backward_products(Z, WS, xt, dH, blk.dWS[:ns], blk.dbS[:ns], n_parts)
    set_chunk_size(chunk)
    block_backward(params, spec, sc, blk, Xc, rows, dH, xt, False)
    return True


@njit(cache=True, nogil=True)
def _update(net, data, rows_out, opt, sched):
    """``block.update``'s kernels (step 7): the touched rows' listing, the hidden layers' step,
    the extras' listing and the three row steps in one loop. ``rows_out`` = (touched bundle,
    row offsets, row path, output rows, their stamps, serial, S, the first layer's listed
    rows and deltas); ``opt`` = ``SparseOptimizer.compiled_step_args()``."""
    params, spec, sc, blk, store = net[0], net[1], net[3], net[4], net[5]
    Xc, rows = data[0], data[2]
    tb, row_off, row_path, out_rows, out_stamp, serial, shared, frows, dels = rows_out
    nb = rows.shape[0]
    nr, nbias = collect_touched(spec, row_off, sc.s_off, sc.ids[:nb], sc.n_act[:nb], Xc, rows,
                                tb, serial, row_path, False)
    touched_step(params, tb, nr, nbias, opt)
    nu = output_entries(blk.extra[:nb], blk.counts[:nb, 2:3], 0, store.d_store.shape[1],
                        out_rows, serial)
    nf = frows.count[0]
    ns = shared.shape[0]
    last = spec.n_layers - 1
    mom_out, tw_first = opt[5], opt[6]
    set_chunk_size(rows_a_chunk(nf + nu + ns, sched[3], sched[4]))
    batch_row_steps(params.W, params.B, mom_out, opt[1], opt[2], np.int64(spec.w_off[last]),
                    np.int64(spec.b_off[last]), frows,
                    (np.int64(nf), Xc.dat, dels, np.int64(spec.w_off[0]),
                     tw_first), out_rows, np.int64(nu), store,
                    (shared, blk.dWS[:ns], blk.dbS[:ns], out_stamp, serial))


@njit(cache=True, nogil=True)
def _block_sum(a, lo, n):
    """numpy's sum of a[lo:lo + n] for n <= 128: eight interleaved partial sums."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r = a[lo:lo + 8].copy()
    i = 8
    while i < n - n % 8:
        for j in range(8):
            r[j] += a[lo + i + j]
        i += 8
    res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    for k in range(i, n):
        res += a[lo + k]
    return res


@njit(cache=True, nogil=True)
def _left_part(n):
    """Where numpy's pairwise sum splits n > 128 values: half, down to a multiple of 8."""
    h = n // 2
    return h - h % 8


@njit(cache=True, nogil=True)
def pairwise_sum(a, lo, n):
    """The sum of a[lo:lo + n] in numpy's order for a float64 array (``np.add.reduce``: blocks
    of up to 128 values, ``_block_sum``, joined as halves), so that a mean taken here is
    numpy's to the bit (checked against ``np.mean`` in tests/test_block_step.py). numpy
    recurses over the halves; here an explicit stack does (a recursive kernel called from a
    cached one crashed when loaded from Numba's cache)."""
    if n <= 128:
        return _block_sum(a, lo, n)
    s_lo, s_n = np.empty(64, np.int64), np.empty(64, np.int64)
    s_left, s_state = np.empty(64, np.float64), np.zeros(64, np.int64)
    top = 0
    s_lo[0], s_n[0] = lo, n
    while True:
        if s_n[top] > 128 and s_state[top] == 0:
            # split: its left half first
            s_state[top] = 1
            s_lo[top + 1], s_n[top + 1], s_state[top + 1] = s_lo[top], _left_part(s_n[top]), 0
            top += 1
            continue
        v = _block_sum(a, s_lo[top], s_n[top])
        top -= 1
        while top >= 0 and s_state[top] == 2:
            v = s_left[top] + v            # both halves done: left + right, as numpy adds
            top -= 1
        if top < 0:
            return v
        # its left half is done: keep it, then the right half
        s_left[top], s_state[top] = v, 2
        h = _left_part(s_n[top])
        s_lo[top + 1], s_n[top + 1], s_state[top + 1] = s_lo[top] + h, s_n[top] - h, 0
        top += 1


@njit(cache=True, nogil=True)
def block_batch(net, data, draw, rows_out, opt, sched):
    """One batch, steps 1-7: ``_forward_backward`` and, when every sample's loss is finite,
    ``_update``. Returns (whether it was applied, the mean loss as ``losses.mean()`` gives
    it, the mean size of the output layer's active sets). The per-sample loops' chunk size
    is restored to Numba's default on return."""
    ok = _forward_backward(net, data, draw, sched)
    if ok:
        _update(net, data, rows_out, opt, sched)
    set_chunk_size(0)
    rows, sc, losses = data[2], net[3], net[6]
    nb = rows.shape[0]
    if nb == 0:
        return ok, np.nan, np.nan
    active = 0
    for s in range(nb):
        active += sc.n_act[s, sc.n_act.shape[1] - 1]
    return ok, pairwise_sum(losses, 0, nb) / nb, active / nb


def train_batch(net, X, Y, rows, seed, serial, optimizer):
    """Steps 1-7 of batch ``rows`` in one compiled call (``block_batch``); returns (mean loss,
    mean active output neurons) as ``Network.train_batch`` reports them (a loss that is not
    finite: nothing was applied and the optimizer's step count is as before). ``frows`` is
    the batch's listing the row steps read; ``listed`` what block_forward still fills (none
    where the draw listed it)."""
    nb = rows.shape[0]
    n_threads = numba.get_num_threads()
    if net.sc.codes.shape[0] < n_threads:
        # the per-thread scratch rows are indexed by numba.get_thread_id()
        batch_size, _, max_labels = net._scratch_key
        net.prepare(batch_size, n_threads, max_labels)
    Xc, Yc = csr(X), csr(Y)
    frows = _block._feature_rows(net, X, rows)
    drawn, listed = _block._draw(net, seed, serial, Xc, rows, frows, n_threads)
    neg = net.negatives.bundle(drawn)
    model = (net.params, net.spec, net.tables, net.sc, net.block, net.store, net.losses)
    draw = (np.uint64(seed), np.int64(serial), drawn, neg, listed, net.correct,
            net.loss_marker)
    sched = (_block.chunk_size(nb, n_threads), _block.product_parts(drawn.shape[0], n_threads),
             _extras.EXTRAS_TASK, row_chunk_sizes(), n_threads)
    # the first layer's deltas, sliced here: a slice made inside the compiled step is typed
    # non-contiguous whatever its extent, and the row steps compiled for that layout ran the
    # first layer's rows 1.9x slower (unvectorised); numpy's view of whole rows is contiguous
    a0, a1 = int(net.sc.a_off[0]), int(net.sc.a_off[1])
    rows_out = (net.touched_rows, net.row_off, net.row_path, net.out_rows, net.out_stamp,
                np.int64(serial), drawn, frows, net.block.dels[:nb, a0:a1])
    opt = optimizer.compiled_step_args(n_threads)
    ok, loss, active = block_batch(model, (Xc, Yc, rows), draw, rows_out, opt, sched)
    if not ok:
        optimizer.cancel_step()
    net.block_shared = drawn
    return loss, active
