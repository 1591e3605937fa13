"""Top-k helpers shared by the network's exact inference, the serving index, the neighbour
vote and the re-ranker: best-first insertion, running top-k (and log-sum-exp) folds over
blocks of logits, and the chunked exact top-k of a dense output layer."""
import numba
import numpy as np
# np.dot's BLAS inside Numba kernels: loaded now, so that the callers' limit of BLAS threads
# (threadpoolctl acts on loaded libraries) covers it
import scipy.linalg.cython_blas  # noqa: F401
from numba import prange

from slide.kernels.expsum import exp_shifted_inplace, max_and_finite
from slide.kernels.jit import njit

MIN_PART_ROWS = 32      # rows a thread's product takes at least (fewer: one product)
# columns a thread's product takes at least where the rows are too few for every thread (a
# block of the re-ranker's 128 held-out rows is 4 row parts: on 16 threads 12 sat idle)
MIN_PART_COLUMNS = 2048


@njit(cache=True, nogil=True)
def insert_best_first(v, j, k, ids, scores):
    """Insert (j, v) into the best-first top-k lists ``ids``/``scores`` (insertion sort)."""
    if v <= scores[k - 1]:
        return
    q = k - 1
    while q > 0 and scores[q - 1] < v:
        scores[q] = scores[q - 1]
        ids[q] = ids[q - 1]
        q -= 1
    scores[q] = v
    ids[q] = j


@njit(cache=True, nogil=True, parallel=True)
def fold_topk(S, base, k, top_ids, top_z):
    """Fold a block of logits S [n, m] (columns ``base``..``base + m - 1``) into each row's
    running top-k (``top_ids``/``top_z`` [n, k], best first; ties: the lower column first).
    Most entries fail one comparison with the k-th best: one pass, no partition or sort."""
    for r in prange(S.shape[0]):
        row = S[r]
        ids = top_ids[r]
        z = top_z[r]
        for j in range(row.shape[0]):
            if row[j] > z[k - 1]:
                insert_best_first(row[j], base + j, k, ids, z)


@njit(cache=True, parallel=True)
def fold_logits(S, base, k, top_ids, top_z, run_max, run_sum):
    """Fold a block of logits S [n, m] (columns ``base``..``base + m - 1`` of the output layer)
    into each row's running top-k (``top_ids``/``top_z`` [n, k], best first) and running
    log-sum-exp (``run_max``, ``run_sum`` of exp(z - run_max)): one pass over the block,
    parallel over rows, libm's exp per entry (``fold_logits_f32``: the vectorised fold)."""
    for r in prange(S.shape[0]):
        # the loop's index cast: int64 where Numba first types the body, uint64 in the
        # parallel build, and the callee would compile for each
        _fold_row_scalar(S[r], base, k, top_ids[r], top_z[r], run_max, run_sum, np.int64(r))


@njit(cache=True, nogil=True)
def _fold_row_scalar(row, base, k, ids, z, run_max, run_sum, r):
    m = run_max[r]
    for j in range(row.shape[0]):
        if row[j] > m:
            m = row[j]
    acc = 0.0
    for j in range(row.shape[0]):
        acc += np.exp(row[j] - m)
        if row[j] > z[k - 1]:
            # a float64 value into the float64 top-k, whatever the block's type (one compile)
            insert_best_first(np.float64(row[j]), base + j, k, ids, z)
    run_sum[r] = run_sum[r] * np.exp(run_max[r] - m) + acc
    run_max[r] = m


@njit(cache=True, parallel=True)
def fold_logits_f32(S, base, k, top_ids, top_z, run_max, run_sum):
    """``fold_logits`` of a float32 block S, which it overwrites: a finite row takes
    vectorised passes -- its maximum, the top-k test (a comparison per entry), then exp and
    sum in place (``slide.kernels.expsum``; libm's exp per entry was ~0.4 of the 0.7 s that
    1,024 rows at 133k labels took); a row with an inf or NaN the scalar loop."""
    for r in prange(S.shape[0]):
        row = S[r]
        ids = top_ids[r]
        z = top_z[r]
        m, finite = max_and_finite(row)
        if not finite:
            _fold_row_scalar(row, base, k, ids, z, run_max, run_sum, np.int64(r))
            continue
        m = max(m, run_max[r])
        for j in range(row.shape[0]):
            if row[j] > z[k - 1]:
                insert_best_first(np.float64(row[j]), base + j, k, ids, z)   # (as above)
        acc = exp_shifted_inplace(row, m)
        run_sum[r] = run_sum[r] * np.exp(run_max[r] - m) + acc
        run_max[r] = m


@njit(cache=True, parallel=True)
def segment_topk(cand_ptr, cand_n, cand_ids, scores, k, out_ids, out_scores):
    """Per row: the k best-scored of its candidates (best first; -1 / -inf padding)."""
    for r in prange(cand_n.shape[0]):
        out_ids[r, :] = -1
        out_scores[r, :] = -np.inf
        a = cand_ptr[r]
        for u in range(a, a + cand_n[r]):
            # int64 ids, as the other callers give them (int32 would compile it again)
            insert_best_first(scores[u], np.int64(cand_ids[u]), k, out_ids[r], out_scores[r])


@njit(cache=True, nogil=True, parallel=True)
def logits_into(H, W, b, S, n_row_parts, n_col_parts):
    """S = H @ W.T + b (float32), in ``n_row_parts`` x ``n_col_parts`` parts over Numba's
    threads, one single-threaded BLAS call each, as the batched engine's block products
    (``slide.network.block``): a row part whole (``np.dot`` into S's rows: no copy), or its
    columns c0..c1 into a part of their own, copied into S with the bias."""
    n, m = H.shape[0], W.shape[0]
    for p in prange(n_row_parts * n_col_parts):
        rp, cp = p // n_col_parts, p % n_col_parts
        r0, r1 = n * rp // n_row_parts, n * (rp + 1) // n_row_parts
        c0, c1 = m * cp // n_col_parts, m * (cp + 1) // n_col_parts
        if r1 <= r0 or c1 <= c0:
            continue
        if n_col_parts == 1:
            np.dot(H[r0:r1], W.T, S[r0:r1])
            for i in range(r0, r1):
                for j in range(m):
                    S[i, j] += b[j]
        else:
            part = np.dot(H[r0:r1], W[c0:c1].T)
            for i in range(r0, r1):
                for j in range(c0, c1):
                    S[i, j] = part[i - r0, j - c0] + b[j]


def dense_logits(H, W, b):
    """``H @ W.T + b``: numpy's product, or for float32 inputs of ``MIN_PART_ROWS`` rows a
    thread or more one product per thread over the rows (``logits_into``; the caller holds
    BLAS to one thread). The two agree to float32 rounding, not always bit for bit: numpy and
    scipy ship OpenBLAS builds of their own, and some builds round a block's edge differently
    by its shape (scipy 1.17.1's 0.3.30: 0.7-4.6 % of a product's entries moved by 1-2 ulps
    when its columns were cut in chunks of 300 or its rows split over two threads)."""
    n_rows, n_cols = split_parts(H, W, b)
    if n_rows * n_cols == 1:
        S = H @ W.T
        S += b
        return S
    S = np.empty((H.shape[0], W.shape[0]), np.float32)
    logits_into(H, W, b, S, n_rows, n_cols)
    return S


def split_parts(H, Wo, bo):
    """(row parts, column parts) that ``dense_logits`` computes side by side ((1, 1): numpy's
    one product): a part a thread, each of ``MIN_PART_ROWS`` rows at least (rows for one part
    only: numpy's product); where the rows give fewer parts than threads, each row part's
    columns are cut in parts of ``MIN_PART_COLUMNS`` at least."""
    if not (H.dtype == Wo.dtype == bo.dtype == np.float32 and H.flags.c_contiguous
            and Wo.flags.c_contiguous):
        return 1, 1
    threads = numba.get_num_threads()
    n_rows = max(1, min(threads, H.shape[0] // MIN_PART_ROWS))
    if n_rows == 1 or n_rows >= threads:
        return n_rows, 1
    return n_rows, max(1, min(threads // n_rows, Wo.shape[0] // MIN_PART_COLUMNS))


def logit_chunks(H, Wo, bo, chunk):
    """(first column, logits ``H @ Wo[c0:c1].T + bo[c0:c1]``) chunk by chunk over the output
    rows: the dense logit block stays rows x chunk at any label count. float32 inputs of
    ``MIN_PART_ROWS`` rows a thread or more: a product per thread over its rows, which the
    caller keeps single-threaded (``slide.network.trainer.blas_single_thread``, as every
    caller does; OpenBLAS's own threads beside Numba's spin against them), faster than one
    product on one BLAS thread or on several."""
    n_lab = Wo.shape[0]
    for c0 in range(0, n_lab, chunk):
        c1 = min(n_lab, c0 + chunk)
        S = dense_logits(H, Wo[c0:c1], bo[c0:c1])
        yield c0, S
        del S       # before the next chunk's product (the caller drops its reference too)


def topk_of_logits(H, Wo, bo, k, chunk=32768):
    """Exact top-k logits of the rows H over the output rows (Wo, bo): (scores, ids), each
    [n, min(k, n_out)], best first, ties to the lower id: one ``fold_topk`` pass per chunk
    (argpartition and a sort per chunk took 2.7x longer at debdeps' 26k labels)."""
    k = min(k, Wo.shape[0])
    top_ids = np.full((H.shape[0], k), -1, np.int64)
    top_z = np.full((H.shape[0], k), -np.inf, np.result_type(H.dtype, Wo.dtype, bo.dtype))
    for c0, S in logit_chunks(H, Wo, bo, chunk):
        fold_topk(S, c0, k, top_ids, top_z)
        del S       # one logit block alive at a time
    return top_z, top_ids


def topk_ids_of_logits(H, Wo, bo, k, chunk=32768):
    """The ids [n, min(k, n_out)] of each row's top-k logits, best first (``topk_of_logits``)."""
    return topk_of_logits(H, Wo, bo, k, chunk)[1]


def topk_lse_of_logits(H, Wo, bo, k, chunk=32768):
    """For the neighbour vote's blend: the top-k logits (float64, best first) and their ids,
    and each row's log-sum-exp over the output rows as (max, sum of exp(z - max)) -- one
    parallel pass per chunk (``fold_logits``)."""
    n, k = H.shape[0], min(k, Wo.shape[0])
    top_ids = np.full((n, k), -1, np.int64)
    top_z = np.full((n, k), -np.inf, np.float64)
    run_max = np.full(n, -np.inf, np.float64)
    run_sum = np.zeros(n, np.float64)
    for c0, S in logit_chunks(H, Wo, bo, chunk):
        fold = fold_logits_f32 if S.dtype == np.float32 else fold_logits
        fold(S, c0, k, top_ids, top_z, run_max, run_sum)
        del S       # one logit block alive at a time, not two
    return top_z, top_ids, run_max, run_sum


def probabilities(z, sigmoid):
    """Label probabilities of a dense block of logits z [n, m] (overwritten): the softmax of
    each row, or the per-label sigmoid. A float32 block's softmax: one parallel pass
    (``softmax_rows``; numpy's max, exp, sum and divide were a quarter of ``predict_proba``
    at 133k labels); rows with an inf or NaN, and float64 blocks, numpy's."""
    if sigmoid:
        return 1.0 / (1.0 + np.exp(-z))
    if z.dtype == np.float32 and z.flags.c_contiguous and z.shape[0]:
        done = np.zeros(z.shape[0], np.bool_)
        softmax_rows(z, done)
        if done.all():
            return z
        rest = ~done
        z[rest] = _numpy_softmax(z[rest])
        return z
    return _numpy_softmax(z)


def _numpy_softmax(z):
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    return p


@njit(cache=True, parallel=True)
def softmax_rows(z, done):
    """Each finite row of the float32 block z replaced by its softmax in place (exp through
    ``expsum``, the sum in float64), ``done[r]`` set; other rows left as they are."""
    for r in prange(z.shape[0]):
        row = z[r]
        m, finite = max_and_finite(row)
        if not finite:
            continue
        inv = 1.0 / exp_shifted_inplace(row, m)
        for j in range(row.shape[0]):
            row[j] = np.float32(row[j] * inv)
        done[r] = True


@njit(cache=True, nogil=True)
def select_inplace(a, n, kth):
    """The kth smallest of a[:n] (0-based; ``np.partition(a[:n], kth)[kth]``), by in-place
    quickselect (a[:n] is reordered). DOPH's top set and the re-ranker's centroid terms use
    it: Numba's own np.partition took ~6 s of a cold compile (two specialisations)."""
    lo = 0
    hi = n - 1
    while lo < hi:
        pivot = a[(lo + hi) >> 1]
        i = lo
        j = hi
        while i <= j:
            while a[i] < pivot:
                i += 1
            while a[j] > pivot:
                j -= 1
            if i <= j:
                tmp = a[i]
                a[i] = a[j]
                a[j] = tmp
                i += 1
                j -= 1
        # a[lo..j] <= pivot, a[i..hi] >= pivot, a[j+1..i-1] == pivot
        if kth <= j:
            hi = j
        elif kth >= i:
            lo = i
        else:
            return a[kth]
    return a[kth]


@njit(cache=True, nogil=True)
def largest_positions(values, a, b, m, out):
    """The positions (ascending) of the m largest of values[a:b] into ``out``, ties to the
    earlier position (the lower id in a sorted list); all of them when there are at most m.
    Returns how many."""
    n = b - a
    if m <= 0:
        return 0
    if n <= m:
        for t in range(n):
            out[t] = a + t
        return n
    thr = select_inplace(values[a:b].copy(), n, n - m)
    ties = m
    for p in range(a, b):
        if values[p] > thr:
            ties -= 1
    kept = 0
    for p in range(a, b):
        if values[p] > thr or (values[p] == thr and ties > 0):
            if values[p] == thr:
                ties -= 1
            out[kept] = p
            kept += 1
    return kept


@njit(cache=True, parallel=True)
def strongest_entries(x_ptr, x_dat, m, keep):
    """keep[p] = True where entry p of a CSR row (``x_ptr``, ``x_dat``) is among its row's m
    largest in magnitude, ties going to the earlier entries (what the first m of a stable
    argsort of -|x| would keep): ``largest_positions`` of the row's magnitudes, a quickselect,
    not a sort (Numba's ``np.argsort`` compiles a generic merge sort into every first fit:
    docs/design.md, "One compile a kernel")."""
    for r in prange(x_ptr.shape[0] - 1):
        p0, p1 = x_ptr[r], x_ptr[r + 1]
        n = p1 - p0
        if n <= m:                  # most rows: all kept, nothing to allocate
            for p in range(p0, p1):
                keep[p] = True
            continue
        magnitudes = np.empty(n, x_dat.dtype)
        for q in range(n):
            magnitudes[q] = abs(x_dat[p0 + q])
        kept = np.empty(m, np.int64)
        for t in range(largest_positions(magnitudes, np.int64(0), n, m, kept)):
            keep[p0 + kept[t]] = True
