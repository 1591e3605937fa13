"""The network's inference: the last hidden layer, exact top-k (every output neuron, BLAS),
serving top-k (the output layer's serving index, ``slide.kernels.lsh.serving``, plus
optionally the highest-bias neurons) and the training tables' sparse top-k (the LSH-selected
neurons plus the highest-bias ones, one Numba call); scores and probabilities. The
vote-blended and re-ranked predictions are ``slide.rank.stack``'s."""
import numba
import numpy as np
from numba import prange

from slide.kernels.arrays import csr, make_scratch
from slide.kernels.jit import njit
from slide.kernels.layers import FASTMATH
from slide.kernels.rng import STREAM_PREDICT, STREAM_SERIAL_STRIDE, stream_seed
from slide.kernels.sample import forward, mark_stamp
from slide.kernels.topk import insert_best_first, probabilities, topk_of_logits
from slide.network.dense import hidden_forward


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
                    rng, mark_stamp(call, s))
            _insert_topk(sc.acts[c, sc.a_off[last]:sc.a_off[last + 1]], n_act[last],
                         ids[sc.s_off[last]:sc.s_off[last + 1]], not spec.sparse[last], k,
                         out_ids[s], out_scores[s])


def hidden(net, X, lo=0, hi=None, n_chunks=None):
    """Last hidden layer (every neuron active) of rows lo..hi-1: float32 [n, h_last]."""
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


def proba(net, X, block=1024):
    """Dense label probabilities [n, n_labels] (float32): the softmax of the logits (the
    per-label sigmoid for loss="sigmoid"). The vote-blended ones: ``slide.rank.stack``."""
    Wo, bo = net.output_view()
    n = X.shape[0]
    out = np.empty((n, Wo.shape[0]), np.float32)
    for lo, hi, H in _hidden_blocks(net, X, block):
        out[lo:hi] = probabilities(H @ Wo.T + bo, net.loss == "sigmoid")
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
