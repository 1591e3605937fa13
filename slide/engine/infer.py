"""Inference: exact top-k (every output neuron, BLAS), serving top-k (the output layer's serving
index, ``slide.lsh.serving``, plus optionally the highest-bias neurons) and the training tables'
sparse top-k (the LSH-selected neurons plus the highest-bias ones, one Numba call)."""
import numpy as np
from numba import njit, prange

from slide._rng import STREAM_PREDICT, STREAM_SERIAL_STRIDE, stream_seed
from slide.engine.arrays import csr
from slide.engine.dense import hidden_forward
from slide.engine.sample import forward
from slide.layers import FASTMATH
from slide.lsh.serving import insert_best_first


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True)
def hidden_batch_kernel(params, spec, h_off, X, lo, hi, out, scratch):
    """Last hidden layer of rows lo..hi-1 with EVERY neuron active (the exact network).
    ``out`` [hi-lo, n_in[last]]; ``scratch`` [n_chunks, sum of hidden sizes]."""
    n = hi - lo
    last = spec.n_layers - 1
    n_chunks = scratch.shape[0]
    for c in prange(n_chunks):
        buf = scratch[c]
        for s in range((c * n) // n_chunks, ((c + 1) * n) // n_chunks):
            r = lo + s
            hidden_forward(params.W, params.B, spec, X.ind[X.ptr[r]:X.ptr[r + 1]],
                           X.dat[X.ptr[r]:X.ptr[r + 1]], h_off, buf)
            for i in range(spec.n_in[last]):
                out[s, i] = buf[h_off[last - 1] + i]


@njit(cache=True, nogil=True)
def _insert_topk(z, m, ids, dense, k, out_ids, out_scores):
    """out_ids/out_scores (length k, best first) = the k best of the m active logits z
    (insertion sort: k is small); -1 / -inf where fewer than k."""
    for q in range(k):
        out_ids[q] = -1
        out_scores[q] = -np.inf
    for t in range(m):
        insert_best_first(z[t], t if dense else ids[t], k, out_ids, out_scores)


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True)
def predict_sparse_kernel(params, spec, tables, sc, X, seed, call, k, prior, out_ids,
                          out_scores):
    """Top-k over the LSH-selected output neurons plus the ``prior`` ids (the same for every
    row; may be empty): the fast serving path. Rows with fewer than k active neurons are padded
    with id -1 / score -inf. ``sc`` has one sample slot per thread chunk."""
    n = X.ptr.shape[0] - 1
    n_chunks = sc.acts.shape[0]
    last = spec.n_layers - 1
    no_shared = np.zeros(0, dtype=np.int32)
    for c in prange(n_chunks):
        ids = sc.ids[c]
        n_act = sc.n_act[c]
        for s in range((c * n) // n_chunks, ((c + 1) * n) // n_chunks):
            x_idx = X.ind[X.ptr[s]:X.ptr[s + 1]]
            x_val = X.dat[X.ptr[s]:X.ptr[s + 1]]
            # STREAM_PREDICT is a compile-time constant here: its change (issue 28) needed this
            # file to change too, or Numba's cache would have kept the old id
            rng = stream_seed(seed, STREAM_PREDICT + call * STREAM_SERIAL_STRIDE, s)
            # the prior ids are forced as the labels are in training (the sampler skips them)
            forward(params, spec, tables, sc, c, ids, n_act, x_idx, x_val, prior, no_shared,
                    rng, (call * 1048576 + s + 1) * 2)
            _insert_topk(sc.acts[c, sc.a_off[last]:sc.a_off[last + 1]], n_act[last],
                         ids[sc.s_off[last]:sc.s_off[last + 1]], not spec.sparse[last], k,
                         out_ids[s], out_scores[s])


def hidden(net, X, lo=0, hi=None, n_chunks=None):
    """Last hidden layer (every neuron active) of rows lo..hi-1: float32 [n, h_last]."""
    import numba
    hi = X.shape[0] if hi is None else hi
    lay = net.layout
    n_chunks = n_chunks or numba.get_num_threads()
    h_off = np.concatenate([[0], np.cumsum(lay.sizes[1:-1])]).astype(np.int64)
    out = np.zeros((hi - lo, int(lay.n_in[-1])), np.float32)
    scratch = np.zeros((n_chunks, int(h_off[-1])), np.float32)
    # int64 row pointers whatever X holds (training's are int64): one compiled specialisation
    Xc = csr(X)._replace(ptr=np.asarray(X.indptr, np.int64))
    hidden_batch_kernel(net.params, net.spec, h_off, Xc, lo, hi, out, scratch)
    return out


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


def topk_ids_of_logits(H, Wo, bo, k, chunk=32768):
    """The ids [n, min(k, n_out)] of each row's top-k logits, best first (``topk_of_logits``)."""
    return topk_of_logits(H, Wo, bo, k, chunk)[1]


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


def topk_lse_of_logits(H, Wo, bo, k, chunk=32768):
    """For the neighbour vote's blend: the top-k logits (float64, best first) and their ids,
    and each row's log-sum-exp over the output rows as (max, sum of exp(z - max)) -- one
    parallel pass per chunk (``slide.neighbours.fold_logits``)."""
    from slide.neighbours import fold_logits
    n, k = H.shape[0], min(k, Wo.shape[0])
    top_ids = np.full((n, k), -1, np.int64)
    top_z = np.full((n, k), -np.inf, np.float64)
    run_max = np.full(n, -np.inf, np.float64)
    run_sum = np.zeros(n, np.float64)
    for c0, S in logit_chunks(H, Wo, bo, chunk):
        fold_logits(S, c0, k, top_ids, top_z, run_max, run_sum)
        del S       # one logit block alive at a time, not two
    return top_z, top_ids, run_max, run_sum


def _hidden_blocks(net, X, block):
    """The last hidden layer of every row (one parallel kernel, before any BLAS call), then
    ``(lo, hi, H[lo:hi])`` for each block of ``block`` rows."""
    H_all = hidden(net, X)
    n = X.shape[0]
    for lo in range(0, n, block):
        hi = min(n, lo + block)
        yield lo, hi, H_all[lo:hi]


def _topk_outputs(n_rows, k, n_out):
    """k capped at the label count, and the zeroed (ids int64, scores float64) [n_rows, k] that
    an exact top-k fills block by block."""
    k_eff = min(k, n_out)
    return k_eff, np.zeros((n_rows, k_eff), np.int64), np.zeros((n_rows, k_eff), np.float64)


def topk_exact(net, X, k, block=1024, chunk=32768, with_scores=False):
    """Exact top-k over ALL output neurons: hidden layer of every row (one parallel kernel),
    then BLAS scores of blocks of rows against chunks of the output rows with a running top-k
    (only BLAS after the kernel: alternating Numba's OpenMP pool and OpenBLAS's threads makes
    each spin against the other). ``with_scores``: (ids, their logits as float64)."""
    Wo, bo = net.output_view()
    k_eff, out, out_scores = _topk_outputs(X.shape[0], k, Wo.shape[0])
    for lo, hi, H in _hidden_blocks(net, X, block):
        out_scores[lo:hi], out[lo:hi] = topk_of_logits(H, Wo, bo, k_eff, chunk)
    return (out, out_scores) if with_scores else out


def topk_blended(net, X, k, memory, n_neighbours, weight, block=1024, chunk=32768):
    """Exact top-k of the network's probabilities blended with the neighbour vote of
    ``memory`` (``slide.neighbours``): (1 - weight) * p_j + weight * vote_j, where p is the
    softmax of the logits (the per-label sigmoid for loss="sigmoid"). Every label is scored;
    the blend's top-k lies in the union of the network's top-k and the voted labels.
    Returns (ids [n, k] int64, their blended scores [n, k] float64)."""
    from slide.neighbours import blend_block, voted_logits
    Wo, bo = net.output_view()
    k_eff, out, out_scores = _topk_outputs(X.shape[0], k, Wo.shape[0])
    sigmoid = net.loss == "sigmoid"
    for lo, hi, H in _hidden_blocks(net, X, block):
        top_z, top_ids, run_max, run_sum = topk_lse_of_logits(H, Wo, bo, k_eff, chunk)
        lse = np.zeros(hi - lo) if sigmoid else run_max + np.log(run_sum)
        V = memory.vote(H, n_neighbours)
        out[lo:hi], out_scores[lo:hi] = blend_block(top_ids, top_z, lse, V,
                                                    voted_logits(H, Wo, bo, V), weight,
                                                    sigmoid, k_eff)
    return out, out_scores


def topk_reranked(net, X, k, memory, reranker, block=1024):
    """Exact top-k by the re-ranker (``slide.rerank``) of the candidates of the network and
    the neighbour vote of ``memory``: (ids [n, k] int64, the re-ranker's probabilities [n, k]
    float64), best first."""
    from slide.data.inputs import slice_rows
    Wo, _ = net.output_view()
    k_eff, out, out_scores = _topk_outputs(X.shape[0], k, Wo.shape[0])
    for lo, hi, H in _hidden_blocks(net, X, block):
        out[lo:hi], out_scores[lo:hi] = reranker.topk(net, slice_rows(X, lo, hi), H, memory,
                                                      k_eff)
    return out, out_scores


def proba(net, X, memory=None, n_neighbours=0, weight=0.0, block=1024):
    """Dense label probabilities [n, n_labels] (float32): the softmax of the logits (the
    per-label sigmoid for loss="sigmoid"), blended with the neighbour vote when ``memory``
    is given."""
    from slide.neighbours import add_vote, probabilities
    Wo, bo = net.output_view()
    n = X.shape[0]
    out = np.empty((n, Wo.shape[0]), np.float32)
    for lo, hi, H in _hidden_blocks(net, X, block):
        p = probabilities(H @ Wo.T + bo, net.loss == "sigmoid")
        if memory is not None:
            add_vote(p, memory.vote(H, n_neighbours), weight)
        out[lo:hi] = p
    return out


def prior_ids(net, n):
    """The ``n`` output neurons with the highest bias (the most probable labels a priori),
    as int32; empty for n = 0 or a dense output layer."""
    _, bo = net.output_view()
    n = min(int(n), bo.shape[0])
    if n <= 0 or not net.sparse[-1]:
        return np.zeros(0, np.int32)
    if n == bo.shape[0]:
        return np.arange(n, dtype=np.int32)
    return np.argpartition(-bo, n - 1)[:n].astype(np.int32)


def topk_sparse(net, X, k, call=0, prior_candidates=0):
    """Top-k over the neurons the samplers select (no labels forced) plus the
    ``prior_candidates`` highest-bias output neurons, parallel over rows. Padded with -1
    where fewer than k neurons are active."""
    import numba
    from slide.engine.arrays import make_scratch
    n_chunks = numba.get_num_threads()
    mins = net.min_active.copy()
    mins[-1] = int(k)      # serving: random fill only to guarantee k candidates
    prior = prior_ids(net, prior_candidates)
    spec = net.spec._replace(min_active=mins, loss_code=0)
    sc = make_scratch(spec, net.lsh, net.uses_tables, n_chunks, n_chunks, prior.shape[0], mins)
    n = X.shape[0]
    out_ids = np.full((n, k), -1, np.int64)
    out_scores = np.full((n, k), -np.inf, np.float32)
    predict_sparse_kernel(net.params, spec, net.tables, sc, csr(X), np.uint64(net.seed),
                          np.int64(call), int(k), prior, out_ids, out_scores)
    return out_ids


def prior_ids_any(net, n):
    """The ``n`` output neurons with the highest bias, whatever the layer's kind (int32)."""
    _, bo = net.output_view()
    n = min(int(n), bo.shape[0])
    if n <= 0:
        return np.zeros(0, np.int32)
    return np.sort(np.argpartition(-bo, n - 1)[:n]).astype(np.int32)


def topk_serving(net, X, k, prior_candidates=0, n_candidates=None):
    """Top-k through the output layer's serving index (built from the weights on first use):
    each row's most-colliding labels plus the ``prior_candidates`` highest-bias ones, scored
    exactly. Padded with -1 where fewer than k labels were scored."""
    ix = net.serving_index()
    Wo, bo = net.output_view()
    H = hidden(net, X)
    return ix.topk(H, Wo, bo, int(k), prior_ids_any(net, prior_candidates), n_candidates)[0]


def scores(net, X, block=1024):
    """Dense output scores (logits) [n, n_labels] of the exact network."""
    Wo, bo = net.output_view()
    n = X.shape[0]
    out = np.empty((n, Wo.shape[0]), np.float32)
    for lo, hi, H in _hidden_blocks(net, X, block):
        out[lo:hi] = H @ Wo.T + bo
    return out
