"""The batched engine's output-layer work outside the shared block S: the extras.

A sample's extras are its active output ids outside S (its labels not in S, the random fill):
their exact logits (``row_logit``, beside S's GEMM columns) and their share of dH. Most
samples have a few, computed in the sample's own loops of ``slide.network.block``; a sample
with more than ``EXTRAS_TASK`` (a row with hundreds of labels) has them cut into tasks
(``extras_tasks``) that the products' parallel loops take beside their BLAS calls, so that
one such sample does not hold one thread while the others wait.
"""
import numpy as np

from slide.kernels.arrays import Extras
from slide.kernels.jit import njit
from slide.kernels.layers import FASTMATH, PREFETCH_AHEAD
from slide.kernels.prefetch import prefetch_row


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def row_logit(W, B, w_off, b_off, j, h):
    """B[j] + (the output layer's row j) . h: an extra's exact logit, summed in index order."""
    n_h = h.shape[0]
    o = w_off + np.int64(j) * n_h
    acc = B[b_off + j]
    for i in range(n_h):
        acc += W[o + i] * h[i]
    return acc


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def range_logits(W, B, w_off, b_off, h, extra, e0, e1, d):
    """d[e] = the exact logit of the sample's e-th extra (``extra``: its active ids outside
    S, in position order), e0 <= e < e1: a walk over those extras' rows only."""
    n_h = h.shape[0]
    for e in range(e0, e1):
        if e + PREFETCH_AHEAD < e1:
            prefetch_row(W, w_off + np.int64(extra[e + PREFETCH_AHEAD]) * n_h, n_h)
        d[e] = row_logit(W, B, w_off, b_off, extra[e], h)


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def add_delta_rows(W, w_off, extra, d, e0, e1, g):
    """g += d[e] * (the output layer's row extra[e]) for e0 <= e < e1: the extras' share of
    a sample's dH."""
    n_h = g.shape[0]
    for e in range(e0, e1):
        if e + PREFETCH_AHEAD < e1:
            # the rows were read for the logits, long enough ago to be out of the caches
            prefetch_row(W, w_off + np.int64(extra[e + PREFETCH_AHEAD]) * n_h, n_h)
        o = w_off + np.int64(extra[e]) * n_h
        de = d[e]
        for q in range(n_h):
            g[q] += de * W[o + q]


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def extras_logits(W, B, w_off, b_off, h, extra, n_fill, log_w2, d):
    """d[e] = the corrected logit of the sample's e-th extra: the C ids first (offset 0),
    then its ``n_fill`` fill ids (offset log_w2)."""
    range_logits(W, B, w_off, b_off, h, extra, 0, extra.shape[0], d)
    fill_offsets(d[:extra.shape[0]], n_fill, log_w2)


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def fill_offsets(d, n_fill, log_w2):
    """The last ``n_fill`` of a sample's extras' logits ``d`` (its fill ids) get their offset
    log_w2, as ``extras_logits`` gives them, where tasks computed the logits."""
    n_x = d.shape[0]
    for e in range(n_x - n_fill, n_x):
        d[e] = d[e] + log_w2


# extras one task takes: a sample with more has its extras' logits and their share of dH cut
# into tasks of this many, which the products' parallel loops take beside their BLAS calls
# (on debcontents one row in a thousand has 2,700+ labels, a large share of its batch's
# extras: as one sample's work it held one thread while the others waited)
EXTRAS_TASK = 64


@njit(cache=True, nogil=True)
def extras_tasks(counts, nb, size):
    """The tasks of the samples with more than ``size`` extras (``counts[s, 2]``): (sample,
    first extra, end) each, in sample order, and ptr [nb + 1] (sample s's tasks are
    tasks[ptr[s]:ptr[s + 1]], none for the others)."""
    ptr = np.zeros(nb + 1, np.int64)
    for s in range(nb):
        n_x = counts[s, 2]
        ptr[s + 1] = ptr[s] + ((n_x + size - 1) // size if n_x > size else 0)
    tasks = np.empty((ptr[nb], 3), np.int64)
    for s in range(nb):
        for i in range(ptr[s + 1] - ptr[s]):
            tasks[ptr[s] + i, 0] = s
            tasks[ptr[s] + i, 1] = i * size
            tasks[ptr[s] + i, 2] = min((i + 1) * size, counts[s, 2])
    return tasks, ptr


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def task_logits(xt, i):
    """Task i's extras' exact logits into ``xt.d`` (their fill offsets come later,
    ``fill_offsets``)."""
    s, e0, e1 = xt.tasks[i, 0], xt.tasks[i, 1], xt.tasks[i, 2]
    range_logits(xt.W, xt.B, xt.w_off, xt.b_off, xt.H[s], xt.extra[s], e0, e1, xt.d[s])


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def task_delta_product(xt, i):
    """Task i's share of dH[s] into ``xt.part[i]`` (``block_backward`` adds the sample's
    parts)."""
    s, e0, e1 = xt.tasks[i, 0], xt.tasks[i, 1], xt.tasks[i, 2]
    xt.part[i, :] = 0.0
    add_delta_rows(xt.W, xt.w_off, xt.extra[s], xt.d[s], e0, e1, xt.part[i])


def extras_bundle(net, nb, H, d):
    """The ``Extras`` of a batch of ``nb`` samples after ``block_forward`` (``net.block``'s
    counts and extras), with the tasks of its samples with many extras."""
    blk = net.block
    last = net.layout.n_layers - 1
    tasks, ptr = extras_tasks(blk.counts, nb, EXTRAS_TASK)
    return Extras(net.W, net.B, np.int64(net.layout.w_off[last]),
                  np.int64(net.layout.b_off[last]), blk.extra[:nb], H, d, tasks, ptr,
                  np.empty((tasks.shape[0], H.shape[1]), np.float32))


def no_extras(H):
    """An ``Extras`` without extras or tasks (the products alone, for tests)."""
    nb = H.shape[0]
    z = np.zeros(1, np.float32)
    return Extras(z, z, np.int64(0), np.int64(0), np.zeros((nb, 1), np.int32), H,
                  np.zeros((nb, 1), np.float32), np.zeros((0, 3), np.int64),
                  np.zeros(nb + 1, np.int64), np.zeros((0, H.shape[1]), np.float32))
