"""Top-k helpers shared by the network's exact inference, the serving index, the neighbour
vote and the re-ranker: best-first insertion, running top-k (and log-sum-exp) folds over
blocks of logits, and the chunked exact top-k of a dense output layer."""
import numpy as np
from numba import njit, prange


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
    parallel over rows."""
    for r in prange(S.shape[0]):
        row = S[r]
        m = run_max[r]
        for j in range(row.shape[0]):
            if row[j] > m:
                m = row[j]
        acc = 0.0
        for j in range(row.shape[0]):
            acc += np.exp(row[j] - m)
            if row[j] > top_z[r, k - 1]:
                insert_best_first(row[j], base + j, k, top_ids[r], top_z[r])
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
            insert_best_first(scores[u], cand_ids[u], k, out_ids[r], out_scores[r])


def logit_chunks(H, Wo, bo, chunk):
    """(first column, logits ``H @ Wo[c0:c1].T + bo[c0:c1]``) chunk by chunk over the output
    rows: the dense logit block stays rows x chunk at any label count."""
    n_lab = Wo.shape[0]
    for c0 in range(0, n_lab, chunk):
        c1 = min(n_lab, c0 + chunk)
        S = H @ Wo[c0:c1].T
        S += bo[c0:c1]
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
        fold_logits(S, c0, k, top_ids, top_z, run_max, run_sum)
        del S       # one logit block alive at a time, not two
    return top_z, top_ids, run_max, run_sum


def probabilities(z, sigmoid):
    """Label probabilities of a dense block of logits z [n, m] (overwritten): the softmax of
    each row, or the per-label sigmoid."""
    if sigmoid:
        return 1.0 / (1.0 + np.exp(-z))
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    return p


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
