"""The batched engine's three products over the shared block S (``slide.network.block``,
steps 2, 3 and 5), each a parallel loop of single-threaded BLAS calls over column or row
blocks, with the extras' tasks (``slide.network.extras``) taken beside them.

The gather of S's rows and the column sums of dZ run inside these loops, each BLAS task over
its own block, instead of as a parallel loop and a numpy call of their own: on many threads
a parallel loop's fork and join costs as much as a small step (``docs/design.md``, "Many
cores"), and a batch ran a dozen of them.

Each task calls sgemm itself (``_gemm``: Numba's own BLAS entry, the one ``np.dot`` uses, with
our leading dimensions), writing its block straight into Z, dH or dW_S. ``np.dot`` on a block
allocated its result, which was then copied into place, and dW_S's operand, a column block of
dZ transposed, had to be copied contiguous first; sgemm called in place skips both copies, with
the same bits (the same sgemm over the same operands).
"""
import numba
import numpy as np
# the BLAS behind Numba's sgemm entry: loaded now, so that the trainer's limit of BLAS threads
# (threadpoolctl acts on loaded libraries) covers it
import scipy.linalg.cython_blas  # noqa: F401
from numba import prange, types
from numba.np.linalg import _BLAS

from slide.kernels.jit import njit
from slide.kernels.layers import PREFETCH_AHEAD
from slide.kernels.prefetch import prefetch_row
from slide.network.extras import task_delta_product, task_logits

# columns (rows of W_S) a BLAS call of the split products takes at least
MIN_PART_COLUMNS = 64

# Numba's BLAS entry (``numba_xxgemm`` in its helper library, called by name: kernels that use
# it stay cacheable): column-major sgemm, C = alpha op(A) op(B) + beta C
_XXGEMM = _BLAS().numba_xxgemm(types.float32)
_ALPHA_BETA = np.array([1.0, 0.0], np.float32)
_N, _T, _SINGLE = ord("n"), ord("t"), ord("s")


@njit(cache=True, nogil=True, inline="always")
def _gemm(ta, tb, m, n, k, A, lda, B, ldb, C, ldc):
    """C[m, n] = op(A) op(B) in BLAS's column-major terms (a row-major r x c block with row
    stride ld is the column-major c x r matrix with leading dimension ld); A, B, C: flat
    float32 arrays starting at the blocks' first elements."""
    ab = _ALPHA_BETA
    _XXGEMM(np.int8(_SINGLE), np.int8(ta), np.int8(tb), m, n, k, ab[0:].ctypes, A.ctypes,
            max(lda, 1), B.ctypes, max(ldb, 1), ab[1:].ctypes, C.ctypes, max(ldc, 1))


def product_parts(n_columns, n_threads=None):
    """How many BLAS calls the batch's products are split into: one per Numba thread
    (``n_threads``; None: Numba's count), each of at least MIN_PART_COLUMNS columns of S."""
    n_threads = numba.get_num_threads() if n_threads is None else n_threads
    return max(1, min(n_threads, n_columns // MIN_PART_COLUMNS))


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


@njit(cache=True, nogil=True)
def spread_parts(n_parts, n_tasks):
    """The order of a products' loop of ``n_parts`` BLAS calls and ``n_tasks`` extras' tasks:
    slot c holds BLAS part k (k < n_parts) or task k - n_parts. The parts sit at slots
    c * n // n_parts, spread over the loop, the tasks in order between them. TBB deals a
    loop by halving its range, the first thread taking the first half: with the parts in the
    loop's first slots one thread ran every BLAS call one after the other while the others
    took the tasks."""
    n = n_parts + n_tasks
    slots = np.empty(n, np.int64)
    is_part = np.zeros(n, np.bool_)
    for c in range(n_parts):
        p = c * n // n_parts
        slots[p] = c
        is_part[p] = True
    k = n_parts
    for i in range(n):
        if not is_part[i]:
            slots[i] = k
            k += 1
    return slots


@njit(cache=True, nogil=True, parallel=True)
def split_forward_product(xt, shared, WS, bS, Z, n_parts):
    """Steps 2 and 3: W_S, b_S = the rows of ``shared`` and Z = H @ WS.T (H = ``xt.H``), as
    ``n_parts`` column blocks over Numba's threads, each gathering its rows and then one
    single-threaded BLAS call (``_gemm``: scipy's OpenBLAS, pinned to one thread by the
    trainer's ``blas_single_thread``), and beside them the extras' logits of ``xt``'s tasks.
    A multi-threaded BLAS beside Numba's spinning workers was 7x slower
    (``block_phases_blas_threads.log``); one single-threaded call left the other cores idle
    for ~15 % of a batch at 670k labels. An empty ``shared``: WS and bS are given."""
    H = xt.H
    nb, h = H.shape
    ns = WS.shape[0]
    Zf, Wf = Z.reshape(-1), WS.reshape(-1)
    slots = spread_parts(n_parts, xt.tasks.shape[0])
    for i in prange(slots.shape[0]):
        c = slots[i]
        if c >= n_parts:
            task_logits(xt, c - n_parts)
            continue
        a = ns * c // n_parts
        b = ns * (c + 1) // n_parts
        _gather(xt, shared, WS, bS, a, b)
        # Z[:, a:b] = H @ WS[a:b].T: column-major, rows a..b of Z^T (ld ns) = WS[a:b] (an h x
        # (b-a) matrix, transposed) times H^T (h x nb)
        _gemm(_T, _N, b - a, nb, h, Wf[a * h:], h, H.reshape(-1), h, Zf[a:], ns)


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
    nb, h = H.shape
    ns = WS.shape[0]
    Zf, Wf, Hf, dHf, dWf = Z.reshape(-1), WS.reshape(-1), H.reshape(-1), dH.reshape(-1), \
        dWS.reshape(-1)
    slots = spread_parts(2 * n_parts, xt.tasks.shape[0])
    for i in prange(slots.shape[0]):
        c = slots[i]
        if c >= 2 * n_parts:
            task_delta_product(xt, c - 2 * n_parts)
        elif c < n_parts:
            a = nb * c // n_parts
            b = nb * (c + 1) // n_parts
            # dH[a:b] = dZ[a:b] @ WS: column-major, dH^T's columns a..b (h x (b-a), ld h) =
            # WS^T (h x ns) times dZ[a:b]^T (ns x (b-a), ld ns)
            _gemm(_N, _N, h, b - a, ns, Wf, h, Zf[a * ns:], ns, dHf[a * h:], h)
        else:
            a = ns * (c - n_parts) // n_parts
            b = ns * (c - n_parts + 1) // n_parts
            # dWS[a:b] = dZ[:, a:b].T @ H: column-major, dWS^T's columns a..b (h x (b-a)) =
            # H^T (h x nb) times (rows a..b of dZ^T, ld ns) transposed
            _gemm(_N, _T, h, b - a, nb, Hf, h, Zf[a:], ns, dWf[a * h:], h)
            _column_sums(Z, dbS, a, b)
