"""The batched engine's three products over the shared block S (``slide.network.block``,
steps 2, 3 and 5), each a parallel loop of single-threaded BLAS calls over column or row
blocks, with the extras' tasks (``slide.network.extras``) taken beside them.

The gather of S's rows and the column sums of dZ run inside these loops, each BLAS task over
its own block, instead of as a parallel loop and a numpy call of their own: a parallel loop's
fork and join costs 57-93 us at 16 threads on TBB (``bench/probes/probe_fork_join.py``), and a
batch ran a dozen of them.
"""
import numba
import numpy as np
# np.dot's BLAS inside Numba kernels: loaded now, so that the trainer's limit of BLAS threads
# (threadpoolctl acts on loaded libraries) covers it
import scipy.linalg.cython_blas  # noqa: F401
from numba import njit, prange

from slide.kernels.layers import PREFETCH_AHEAD
from slide.kernels.prefetch import prefetch_row
from slide.network.extras import task_delta_product, task_logits

# columns (rows of W_S) a BLAS call of the split products takes at least
MIN_PART_COLUMNS = 64


def product_parts(n_columns):
    """How many BLAS calls the batch's products are split into: one per Numba thread, each of
    at least MIN_PART_COLUMNS columns of S."""
    return max(1, min(numba.get_num_threads(), n_columns // MIN_PART_COLUMNS))


@njit(cache=True, nogil=True, inline="always")
def _gather(xt, shared, WS, bS, a, b):
    """WS[i] = the output layer's row shared[i] (in ``xt.W``), bS[i] its bias, for a <= i < b
    (none when ``shared`` is empty: WS is given)."""
    n_in = WS.shape[1]
    W = xt.W
    b = min(b, shared.shape[0])
    for i in range(a, b):
        if i + PREFETCH_AHEAD < b:
            prefetch_row(W, xt.w_off + np.int64(shared[i + PREFETCH_AHEAD]) * n_in, n_in)
        o = xt.w_off + np.int64(shared[i]) * n_in
        row = WS[i]
        for q in range(n_in):           # not WS[i, :] = ...: see sample._append_shared
            row[q] = W[o + q]
        bS[i] = xt.B[xt.b_off + shared[i]]


@njit(cache=True, nogil=True, parallel=True)
def split_forward_product(xt, shared, WS, bS, Z, n_parts):
    """Steps 2 and 3: W_S, b_S = the rows of ``shared`` and Z = H @ WS.T (H = ``xt.H``), as
    ``n_parts`` column blocks over Numba's threads, each gathering its rows and then one
    single-threaded BLAS call (``np.dot``: scipy's OpenBLAS, pinned to one thread by the
    trainer's ``blas_single_thread``), and beside them the extras' logits of ``xt``'s tasks.
    A multi-threaded BLAS beside Numba's spinning workers was 7x slower
    (``block_phases_blas_threads.log``); one single-threaded call left the other cores idle
    for ~15 % of a batch at 670k labels. An empty ``shared``: WS and bS are given."""
    H = xt.H
    ns = WS.shape[0]
    for c in prange(n_parts + xt.tasks.shape[0]):
        if c >= n_parts:
            task_logits(xt, c - n_parts)
            continue
        a = ns * c // n_parts
        b = ns * (c + 1) // n_parts
        _gather(xt, shared, WS, bS, a, b)
        _copy_block(np.dot(H, WS[a:b].T), Z, 0, a)


@njit(cache=True, nogil=True, inline="always")
def _copy_block(P, out, r0, c0):
    """out[r0:r0 + P.shape[0], c0:c0 + P.shape[1]] = P, element by element: a slice
    assignment compiles a shape-check error path of its own (~2 s of a cold compile, Numba's
    event log)."""
    for i in range(P.shape[0]):
        for j in range(P.shape[1]):
            out[r0 + i, c0 + j] = P[i, j]


@njit(cache=True, nogil=True, inline="always")
def _column_sums(Z, out, a, b):
    """out[a:b] = the sums of Z's columns a..b-1, row after row: the order (and so the bits)
    of ``np.sum(Z, axis=0)`` wherever Z has two columns or more (one column is a contiguous
    run, which numpy sums pairwise), and the same whatever the split."""
    for j in range(a, b):
        out[j] = Z[0, j]
    for i in range(1, Z.shape[0]):
        for j in range(a, b):
            out[j] += Z[i, j]


@njit(cache=True, nogil=True, parallel=True)
def split_backward_products(Z, WS, xt, dH, dWS, dbS, n_parts):
    """Step 5, dH = dZ @ WS, dWS = dZ.T @ H (H = ``xt.H``) and dbS = the column sums of dZ,
    as ``n_parts`` row blocks of each over Numba's threads (as ``split_forward_product``; a
    block of dWS sums its columns of dZ too), and beside them the extras' share of dH for
    ``xt``'s tasks (into ``xt.part``). Each entry of the products is one BLAS dot product
    over the whole inner dimension, as in one unsplit call."""
    H = xt.H
    nb = Z.shape[0]
    ns = WS.shape[0]
    for c in prange(2 * n_parts + xt.tasks.shape[0]):
        if c >= 2 * n_parts:
            task_delta_product(xt, c - 2 * n_parts)
        elif c < n_parts:
            a = nb * c // n_parts
            b = nb * (c + 1) // n_parts
            _copy_block(np.dot(Z[a:b], WS), dH, a, 0)
        else:
            a = ns * (c - n_parts) // n_parts
            b = ns * (c - n_parts + 1) // n_parts
            _copy_block(np.dot(np.ascontiguousarray(Z[:, a:b].T), H), dWS, a, 0)
            _column_sums(Z, dbS, a, b)
