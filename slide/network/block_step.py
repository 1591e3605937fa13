"""The batched engine's batch as one compiled call: ``slide.network.block``'s steps 1-7, the
same kernels in the same order with the same arguments, called from a Numba function.

A batch reads and writes three things, each a bundle here: the model (``BatchModel``: the
weights and biases every batch shares, with the hidden layers' gradient buffers of the
worker that trains it), the worker's scratch (``BatchWork``, ``RowLists``: see
``slide.network.worker``) and the batch itself (``BatchInput``, ``BatchDraw``). Python draws
the negatives and claims the optimizer's step (``claim``), in batch order, then gives the
batch a worker's scratch (``bind``); the compiled call (``block_batch``, or for a batch on one
thread its build without parallel loops: ``run_batch``) releases the GIL, so
several batches claimed this way run at once on several threads
(``slide.network.inflight``). A batch run by itself
(``train_batch``) is the same bits as the Python sequence of ``slide.network.block``.

``applies(net)`` says which networks take it: every batched network (the per-sample engine
``slide.network.batch`` is the reference the tests hold it to, and the dense network has its
own batch, ``slide.network.dense``). ``forward_backward`` and ``update`` run the two halves
apart, for tests and diagnostics that read the gradients in between.
"""
from typing import NamedTuple

import numba
import numpy as np

from slide.kernels.arrays import Csr, Extras, Params, csr
from slide.kernels.jit import njit
from slide.kernels.one_thread import one_thread
from slide.kernels.threads import set_chunk_size
from slide.kernels.touched import collect_touched, output_entries
from slide.network import block as _block
from slide.network.adam import touched_step
from slide.network.extras import EXTRAS_TASK, extras_tasks
from slide.network.optim import ROW_CHUNKS, BatchStep, RowChunks, rows_a_chunk
from slide.network.block import (block_backward, block_forward, block_loss, block_offsets,
                                 split_backward_products, split_forward_product)
from slide.network.row_steps import batch_row_steps


class BatchModel(NamedTuple):
    """The model as one batch sees it."""
    params: Params           # W, B (shared); GW, GB (the worker's gradient buffers)
    spec: object             # the layers' ``Spec``
    tables: object           # the LSH ``Tables`` (None without)
    first_fused: bool        # a dense first layer: its rows stepped from the deltas


class BatchWork(NamedTuple):
    """The worker's per-sample and per-thread scratch (``slide.network.worker``)."""
    sc: object               # ``Scratch``
    blk: object              # ``Block``
    store: object            # ``Store``
    losses: np.ndarray       # [batch] float64


class BatchInput(NamedTuple):
    X: Csr
    Y: Csr
    rows: np.ndarray         # the batch's row ids


class BatchDraw(NamedTuple):
    """The batch's shared negatives and the loss's settings."""
    seed: np.uint64
    serial: np.int64         # the batch's number (1-based over the run)
    shared: np.ndarray       # sorted int32 ids of the shared block S
    neg: object              # ``SharedDraw``: the correction's offsets
    correct: bool            # the sampling correction
    each: object             # the loss's marker (``losses.loss_marker``)


class Schedule(NamedTuple):
    """How the batch's loops deal their work to ``n_threads`` threads."""
    chunk: int               # samples a thread takes at a time
    n_parts: int             # the products' BLAS parts
    extras_task: int         # extras a task (``slide.network.extras``)
    row_chunks: RowChunks    # the row steps' chunks
    n_threads: int


class RowLists(NamedTuple):
    """The worker's listings of the rows the batch updates."""
    touched: object          # ``Touched``: the hidden layers' rows and biases
    row_off: np.ndarray      # the layout's row offsets
    row_path: bool           # the output layer takes the per-row path
    out_rows: object         # ``OutputRows``: the extras' rows, per row
    out_stamp: np.ndarray    # per output neuron: the last batch that updated it
    frows: object            # ``FeatureRows``: the batch's input by feature
    dels: np.ndarray         # [batch, h1] the first layer's deltas (``first_deltas``)
    copy_first: bool         # dels is the block's copy, filled from its deltas (2+ layers)


class Claim(NamedTuple):
    """A batch as ``claim`` readies it, before a worker takes it (``bind``)."""
    data: BatchInput
    draw: BatchDraw
    step: BatchStep
    sched: Schedule


class BatchCall(NamedTuple):
    """Everything ``block_batch`` takes for one batch (``bind``)."""
    model: BatchModel
    work: BatchWork
    data: BatchInput
    draw: BatchDraw
    lists: RowLists
    step: BatchStep
    sched: Schedule


def applies(net):
    """Whether ``net``'s batches take the compiled step: the batched engine (a sampled output
    layer after hidden layers, ``engine="batched"``)."""
    return net.batched


@njit(cache=True, nogil=True)
def all_finite(a):
    """Whether every entry of the 1-D array ``a`` is finite."""
    for i in range(a.shape[0]):
        if not np.isfinite(a[i]):
            return False
    return True


# The two halves of a batch are inlined into ``block_batch``: Numba links a callee's machine code
# into its caller's and generates it again there, so each compiled level between Python and the
# batch's kernels compiled all of them once more (bench/results/first_fit_debtags.md, the
# kernels' own compile seconds). ``forward_backward`` and ``update`` still call them alone.
@njit(cache=True, nogil=True, inline="always")
def _forward_backward(model, work, data, draw, frows, sched):
    """``block.forward_backward``'s kernels (steps 1-6); block_forward lists the batch's input
    by feature into ``frows`` beside its samples. False as soon as a sample's loss is not
    finite (nothing is applied then)."""
    params, spec, sc, blk = model.params, model.spec, work.sc, work.blk
    rows, shared = data.rows, draw.shared
    nb = rows.shape[0]
    H, losses, d_store = work.store.h_store[:nb], work.losses[:nb], work.store.d_store[:nb]
    set_chunk_size(sched.chunk)
    block_forward(params, spec, model.tables, sc, blk, data.X, data.Y, rows, draw.seed,
                  draw.serial, shared, shared[:0], H, losses, frows)
    if not all_finite(losses):
        return False
    ns = shared.shape[0]
    WS, bS = blk.WS[:ns], blk.bS[:ns]
    Z = blk.Z.reshape(-1)[:nb * ns].reshape(nb, ns)
    last = spec.n_layers - 1
    tasks, ptr = extras_tasks(blk.counts, nb, sched.extras_task)
    xt = Extras(params.W, params.B, np.int64(spec.w_off[last]), np.int64(spec.b_off[last]),
                blk.extra[:nb], H, d_store, tasks, ptr,
                np.empty((tasks.shape[0], H.shape[1]), np.float32))
    set_chunk_size(1)
    split_forward_product(xt, shared, WS, bS, Z, sched.n_parts)
    offs = block_offsets(bS, shared, draw.neg)
    set_chunk_size(sched.chunk)
    block_loss(params, spec, sc, blk, data.Y, rows, draw.neg, Z, offs, xt, losses,
               np.float32(1.0 / nb), draw.correct, draw.each)
    if not all_finite(losses):
        return False
    dH = blk.dH[:nb]
    set_chunk_size(1)
    split_backward_products(Z, WS, xt, dH, blk.dWS[:ns], blk.dbS[:ns], sched.n_parts)
    set_chunk_size(sched.chunk)
    block_backward(params, spec, sc, blk, data.X, rows, dH, xt, not model.first_fused)
    return True


@njit(cache=True, nogil=True, inline="always")
def _update(model, work, data, draw, lists, step, sched):
    """``block.update``'s kernels (step 7): the touched rows' listing, the hidden layers' step,
    the extras' listing and the three row steps in one loop."""
    params, spec, sc, blk, store = model.params, model.spec, work.sc, work.blk, work.store
    rows, serial, shared, frows = data.rows, draw.serial, draw.shared, lists.frows
    nb = rows.shape[0]
    nr, nbias = collect_touched(spec, lists.row_off, sc.s_off, sc.ids[:nb], sc.n_act[:nb],
                                data.X, rows, lists.touched, serial, lists.row_path,
                                not model.first_fused)
    touched_step(params, lists.touched, nr, nbias, step.touched)
    nu = output_entries(blk.extra[:nb], blk.counts[:nb, 2:3], 0, store.d_store.shape[1],
                        lists.out_rows, serial)
    nf = frows.count[0]
    if lists.copy_first and nf > 0:
        _copy_first_deltas(blk.dels, sc.a_off[0], lists.dels, nb)
    ns = shared.shape[0]
    last = spec.n_layers - 1
    set_chunk_size(rows_a_chunk(nf + nu + ns, sched.row_chunks, sched.n_threads))
    batch_row_steps(params.W, params.B, step.out_moments, step.touched.hyper, step.touched.kind,
                    np.int64(spec.w_off[last]), np.int64(spec.b_off[last]), frows,
                    (np.int64(nf), data.X.dat, lists.dels, np.int64(spec.w_off[0]),
                     step.first_records), lists.out_rows, np.int64(nu), store,
                    (shared, blk.dWS[:ns], blk.dbS[:ns], lists.out_stamp, serial))


@njit(cache=True, nogil=True)
def _copy_first_deltas(dels, a0, out, nb):
    """out[s] = the first layer's deltas of sample s (``dels[s, a0:a0 + h1]``), s < nb."""
    for s in range(nb):
        for i in range(out.shape[1]):
            out[s, i] = dels[s, a0 + i]


def first_deltas(block, a_off, nb):
    """The first layer's deltas of a batch of nb samples as whole rows, and whether the
    compiled step copies them there: with one hidden layer a view of the block's deltas; with
    more, the block's copy (``Block.dels1``). A column slice of the deltas would be typed
    non-contiguous: a second compiled batch, and its row steps ran the first layer's rows 1.9x
    slower (unvectorised); numpy's view of whole rows is contiguous."""
    a0, a1 = int(a_off[0]), int(a_off[1])
    if a1 - a0 == block.dels.shape[1]:
        return block.dels[:nb], False
    return block.dels1[:nb], True


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
def block_batch(call):
    """One batch, steps 1-7: ``_forward_backward`` and, when every sample's loss is finite,
    ``_update``. Returns (whether it was applied, the mean loss as ``losses.mean()`` gives
    it, the mean size of the output layer's active sets). The per-sample loops' chunk size
    is restored to Numba's default on return."""
    ok = _forward_backward(call.model, call.work, call.data, call.draw, call.lists.frows,
                           call.sched)
    if ok:
        _update(call.model, call.work, call.data, call.draw, call.lists, call.step, call.sched)
    set_chunk_size(0)
    sc, losses = call.work.sc, call.work.losses
    nb = call.data.rows.shape[0]
    if nb == 0:
        return ok, np.nan, np.nan
    active = 0
    for s in range(nb):
        active += sc.n_act[s, sc.n_act.shape[1] - 1]
    # np.int64(0): a literal 0 would compile _block_sum a second time
    return ok, pairwise_sum(losses, np.int64(0), nb) / nb, active / nb


# A batch on one thread (each of ``batches_in_flight`` workers on a thread of its own: the
# default up to 7 cores) runs the same kernels built without parallel loops: they compile in
# less time and compute the same bits (``slide.kernels.one_thread``). The row steps keep their
# parallel build, which trained the network faster even on one thread (docs/design.md, "A batch
# on one thread").
_forward_backward_one_thread = one_thread(_forward_backward, {
    "block_forward": one_thread(block_forward), "block_loss": one_thread(block_loss),
    "block_backward": one_thread(block_backward),
    "split_forward_product": one_thread(split_forward_product),
    "split_backward_products": one_thread(split_backward_products)})
block_batch_one_thread = one_thread(block_batch,
                                    {"_forward_backward": _forward_backward_one_thread})


def run_batch(call):
    """``block_batch(call)``, or its one-thread build where the batch has one thread."""
    kernel = block_batch_one_thread if call.sched.n_threads == 1 else block_batch
    return kernel(call)


def claim(net, X, Y, rows, seed, serial, optimizer, n_threads=None):
    """Batch ``rows`` (number ``serial``) readied for any worker on ``n_threads`` threads
    (None: Numba's count on this thread): its negatives drawn, the optimizer's step claimed
    (at its current ``learning_rate``; None: no step, for ``forward_backward``). Batches in
    flight are claimed in batch order, so that
    their draws and steps are those of one batch after another."""
    nb = rows.shape[0]
    n_threads = numba.get_num_threads() if n_threads is None else int(n_threads)
    drawn = _block._draw(net, seed, serial, n_threads)
    draw = BatchDraw(np.uint64(seed), np.int64(serial), drawn, net.negatives.bundle(drawn),
                     net.correct, net.loss_marker)
    sched = Schedule(_block.chunk_size(nb, n_threads),
                     _block.product_parts(drawn.shape[0], n_threads), EXTRAS_TASK, ROW_CHUNKS,
                     n_threads)
    step = optimizer.compiled_step_args(n_threads) if optimizer is not None else None
    return Claim(BatchInput(csr(X), csr(Y), rows), draw, step, sched)


def bind(net, claimed, X, worker=None):
    """The ``BatchCall`` of the claimed batch ``claimed`` (``X``: its input matrix) on
    ``worker``'s scratch (None: the network's own)."""
    work = net if worker is None else worker
    rows = claimed.data.rows
    nb = rows.shape[0]
    if work.sc.codes.shape[0] < claimed.sched.n_threads:
        # the per-thread scratch rows are indexed by numba.get_thread_id()
        batch_size, _, max_labels = net._scratch_key
        net.prepare(batch_size, claimed.sched.n_threads, max_labels)
    frows = _block.feature_rows(work, net.layout, X, rows) if net.fused_first \
        else _block.NO_FEATURE_ROWS
    dels, copy_first = first_deltas(work.block, work.sc.a_off, nb)
    lists = RowLists(work.touched_rows, net.row_off, net.row_path, work.out_rows,
                     work.out_stamp, frows, dels, copy_first)
    model = BatchModel(Params(net.W, net.B, work.GW, work.GB), net.spec, net.tables,
                       net.fused_first)
    return BatchCall(model, BatchWork(work.sc, work.block, work.store, work.losses),
                     claimed.data, claimed.draw, lists, claimed.step, claimed.sched)


def train_batch(net, X, Y, rows, seed, serial, optimizer):
    """Steps 1-7 of batch ``rows`` in one compiled call (``block_batch``); returns (mean loss,
    mean active output neurons) as ``Network.train_batch`` reports them (a loss that is not
    finite: nothing was applied and the optimizer's step count is as before)."""
    call = bind(net, claim(net, X, Y, rows, seed, serial, optimizer), X)
    ok, loss, active = run_batch(call)
    if not ok:
        optimizer.cancel_step()
    net.block_shared = call.draw.shared
    return loss, active


@njit(cache=True, nogil=True)
def _default_chunks():
    set_chunk_size(0)


def forward_backward(net, X, Y, rows, seed, serial):
    """Steps 1-6 of batch ``rows`` on the network's own scratch, nothing applied (tests and
    diagnostics): the per-sample losses (NaN where a sample could not be computed). The
    gradients stay in the scratch for ``update``."""
    call = bind(net, claim(net, X, Y, rows, seed, serial, None), X)
    _forward_backward(call.model, call.work, call.data, call.draw, call.lists.frows,
                      call.sched)
    _default_chunks()
    net.block_shared = call.draw.shared
    net.pending_batch = call
    return call.work.losses[:rows.shape[0]]


def update(net, optimizer):
    """Step 7 of the batch ``forward_backward`` left pending: one optimizer step (claimed
    here) over the rows it touched."""
    call = net.pending_batch
    call = call._replace(step=optimizer.compiled_step_args(call.sched.n_threads))
    net.pending_batch = None
    _update(call.model, call.work, call.data, call.draw, call.lists, call.step, call.sched)
    _default_chunks()
