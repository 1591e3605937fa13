"""The training engine: one Numba call per batch (HOGWILD over samples), touched-row
bookkeeping, exact and sparse inference, and the rehash schedule.

Per sample, in its thread's scratch (see ``_sample_pass``):

    h0 = relu(b0 + sum_j x_j W0T[j])                 layer 0: only x's nonzero features
    for each later layer: active = all neurons, or LSH sampler(h_in) (+ true labels on the
                          output layer) padded with random neurons to min_active;
                          z = W[active] h_in + b[active]   (only the active rows)
    softmax (or sigmoid) over the active logits; delta = p - y/|y|
    backward by message passing: g[active] += outer(delta, h_in); d_in = W[active]^T delta
    g0T[x.indices] += outer(x.data, d0)

Threads add into the shared gradient buffers without locks (HOGWILD); the optimizer runs once
after the batch on the deduplicated touched rows (``collect_touched`` + ``slide.optim``).
"""
import math

import numpy as np
from numba import njit, prange

from slide._rng import stream_seed, randint
from slide.layers import (first_forward_dense, first_forward_sparse, first_backward,
                          rows_forward, rows_backward)

LOSSES = {"softmax": 0, "sigmoid": 1}

# Streams of the counter RNG (slide._rng): what a draw is for.
STREAM_SAMPLE = 7          # per (batch serial, sample position): sampler / random fill
STREAM_PREDICT = 11        # per (call, sample): random fill at sparse inference


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True, inline="always")
def _is_label(labels, j):
    """Binary search of ``j`` in the sorted label ids of one sample."""
    lo = 0
    hi = labels.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        v = labels[mid]
        if v < j:
            lo = mid + 1
        elif v > j:
            hi = mid
        else:
            return True
    return False


@njit(cache=True, nogil=True, fastmath=True)
def _output_loss(z, n_act, dense, ids, labels, loss_code, scale, delta):
    """Loss of one sample over its active logits z[:n_act]; writes scale * dLoss/dz to delta.

    softmax: cross-entropy against the target distribution 1/|y| on each true label (the SLIDE
    paper / TF baseline); sigmoid: binary cross-entropy summed over the active outputs.
    """
    ny = labels.shape[0]
    if loss_code == 0:
        if ny == 0:
            # no target distribution: the sample contributes nothing
            for k in range(n_act):
                delta[k] = 0.0
            return 0.0
        zmax = -np.inf
        for k in range(n_act):
            if z[k] > zmax:
                zmax = z[k]
        ssum = 0.0
        for k in range(n_act):
            e = math.exp(z[k] - zmax)
            delta[k] = e
            ssum += e
        inv = 1.0 / ssum
        logs = math.log(ssum)
        w = 1.0 / ny
        loss = 0.0
        for k in range(n_act):
            j = k if dense else ids[k]
            d = delta[k] * inv
            if _is_label(labels, j):
                d -= w
                loss -= w * (z[k] - zmax - logs)
            delta[k] = d * scale
        return loss
    else:
        loss = 0.0
        for k in range(n_act):
            j = k if dense else ids[k]
            zk = z[k]
            y = 1.0 if _is_label(labels, j) else 0.0
            # stable BCE: max(z,0) - z*y + log(1 + exp(-|z|))
            loss += max(zk, 0.0) - zk * y + math.log1p(math.exp(-abs(zk)))
            if zk >= 0:
                p = 1.0 / (1.0 + math.exp(-zk))
            else:
                ez = math.exp(zk)
                p = ez / (1.0 + ez)
            delta[k] = (p - y) * scale
        return loss


@njit(cache=True, nogil=True)
def _fill_active(n_out, labels, forced, min_active, rng, ids, mark, serial):
    """Dense-free active set without LSH: the true labels (if ``forced``) plus random neurons
    up to ``min_active``. ``mark`` is a per-thread stamp array of length n_out that is never
    cleared: mark[j] == serial means j is already in the set."""
    n = 0
    if forced:
        for i in range(labels.shape[0]):
            j = labels[i]
            if mark[j] != serial:
                mark[j] = serial
                ids[n] = j
                n += 1
    target = min(min_active, n_out)
    while n < target:
        rng, j = randint(rng, n_out)
        if mark[j] != serial:
            mark[j] = serial
            ids[n] = j
            n += 1
    return n, rng


# ----------------------------------------------------------------------------------------------
# One sample
# ----------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True, fastmath=True)
def _sample_pass(W, B, GW, GB, n_layers, n_in, n_out, w_off, b_off, a_off, s_off,
                 sparse, min_active, loss_code, x_idx, x_val, labels, rng, scale,
                 acts, dels, ids, n_act, mark, serial, backward):
    """Forward (and optionally backward) of one sample. ``acts``/``dels``: this thread's
    activation/delta scratch (layer l at a_off[l]); ``ids``: this sample's active ids of the
    sparse layers (layer l at s_off[l]); ``n_act[l]`` receives the active counts. Returns the
    loss."""
    last = n_layers - 1
    # ---- layer 0 (sparse input) ----
    n0 = n_out[0]
    a0 = acts[a_off[0]:a_off[1]]
    if sparse[0]:
        id0 = ids[s_off[0]:s_off[1]]
        cnt, rng = _fill_active(n0, labels, last == 0, min_active[0], rng, id0,
                                mark[0], serial)
        n_act[0] = cnt
        first_forward_sparse(W, B, w_off[0], b_off[0], n0, x_idx, x_val, id0, cnt, a0)
    else:
        n_act[0] = n0
        first_forward_dense(W, B, w_off[0], b_off[0], n0, x_idx, x_val, a0)
    # ---- later layers ----
    for l in range(1, n_layers):
        a_in = acts[a_off[l - 1]:a_off[l]]
        a_l = acts[a_off[l]:a_off[l + 1]]
        id_in = ids[s_off[l - 1]:s_off[l]]
        id_l = ids[s_off[l]:s_off[l + 1]]
        if sparse[l]:
            cnt, rng = _fill_active(n_out[l], labels, l == last, min_active[l], rng, id_l,
                                    mark[l], serial)
            n_act[l] = cnt
        else:
            n_act[l] = n_out[l]
        rows_forward(W, B, w_off[l], b_off[l], n_in[l], not sparse[l - 1], id_in, a_in,
                     n_act[l - 1], not sparse[l], id_l, n_act[l], l != last, a_l)
    # ---- loss ----
    z = acts[a_off[last]:a_off[last + 1]]
    d_last = dels[a_off[last]:a_off[last + 1]]
    loss = _output_loss(z, n_act[last], not sparse[last], ids[s_off[last]:s_off[last + 1]],
                        labels, loss_code, scale, d_last)
    if not backward:
        return loss
    # ---- backward ----
    for l in range(last, 0, -1):
        a_in = acts[a_off[l - 1]:a_off[l]]
        d_in = dels[a_off[l - 1]:a_off[l]]
        rows_backward(W, GW, GB, w_off[l], b_off[l], n_in[l], not sparse[l - 1],
                      ids[s_off[l - 1]:s_off[l]], a_in, n_act[l - 1], not sparse[l],
                      ids[s_off[l]:s_off[l + 1]], n_act[l], dels[a_off[l]:a_off[l + 1]], d_in)
        for m in range(n_act[l - 1]):
            if a_in[m] <= 0.0:       # ReLU mask (a_in is the post-ReLU activation)
                d_in[m] = 0.0
    first_backward(GW, GB, w_off[0], b_off[0], n0, x_idx, x_val, not sparse[0],
                   ids[s_off[0]:s_off[1]], n_act[0], dels[a_off[0]:a_off[1]])
    return loss


# ----------------------------------------------------------------------------------------------
# One batch
# ----------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True, fastmath=True, parallel=True)
def train_batch_kernel(W, B, GW, GB, n_layers, n_in, n_out, w_off, b_off, a_off, s_off,
                       sparse, min_active, loss_code,
                       X_ptr, X_ind, X_dat, Y_ptr, Y_ind, rows, seed, serial,
                       acts, dels, ids, n_act, marks, losses):
    """Forward + backward of every sample of the batch ``rows``, HOGWILD over samples.

    Scratch: ``acts``/``dels`` [n_chunks, a_off[-1]] and ``marks`` [n_chunks, n_layers, *]
    per thread chunk; ``ids`` [batch, s_off[-1]] and ``n_act`` [batch, n_layers] per sample
    (kept after the call: they list the touched rows). Gradients of the batch MEAN loss are
    added into GW/GB. Draws come from stream_seed(seed, serial, sample position)."""
    nb = rows.shape[0]
    n_chunks = acts.shape[0]
    scale = 1.0 / nb
    for c in prange(n_chunks):
        lo = (c * nb) // n_chunks
        hi = ((c + 1) * nb) // n_chunks
        for s in range(lo, hi):
            r = rows[s]
            x_idx = X_ind[X_ptr[r]:X_ptr[r + 1]]
            x_val = X_dat[X_ptr[r]:X_ptr[r + 1]]
            labels = Y_ind[Y_ptr[r]:Y_ptr[r + 1]]
            rng = stream_seed(seed, STREAM_SAMPLE + serial * 16, s)
            losses[s] = _sample_pass(W, B, GW, GB, n_layers, n_in, n_out, w_off, b_off, a_off,
                                     s_off, sparse, min_active, loss_code, x_idx, x_val, labels,
                                     rng, scale, acts[c], dels[c], ids[s], n_act[s], marks[c],
                                     serial * 1048576 + s + 1, True)


@njit(cache=True, nogil=True)
def collect_touched(n_layers, n_in, n_out, w_off, b_off, row_off, sparse, s_off,
                    X_ptr, X_ind, rows, ids, n_act, stamp_rows, stamp_bias, serial,
                    starts, lens, bias_ids):
    """Deduplicated list of the rows (and biases) the batch touched, for the optimizer.

    Layer 0 rows are the batch's input features (row length n_out[0]); later layers' rows are
    their active neurons (all of them for a dense layer). ``stamp_*`` are never cleared:
    stamp == serial means already listed in this batch. Returns (n_rows, n_bias)."""
    nr = 0
    nbias = 0
    nb = rows.shape[0]
    # layer 0: input features
    n0 = n_out[0]
    for s in range(nb):
        r = rows[s]
        for p in range(X_ptr[r], X_ptr[r + 1]):
            f = X_ind[p]
            if stamp_rows[row_off[0] + f] != serial:
                stamp_rows[row_off[0] + f] = serial
                starts[nr] = w_off[0] + np.int64(f) * n0
                lens[nr] = n0
                nr += 1
    for l in range(n_layers):
        if sparse[l]:
            for s in range(nb):
                for k in range(n_act[s, l]):
                    j = ids[s, s_off[l] + k]
                    if stamp_bias[b_off[l] + j] != serial:
                        stamp_bias[b_off[l] + j] = serial
                        bias_ids[nbias] = b_off[l] + j
                        nbias += 1
                        if l > 0:
                            starts[nr] = w_off[l] + np.int64(j) * n_in[l]
                            lens[nr] = n_in[l]
                            nr += 1
        else:
            for j in range(n_out[l]):
                bias_ids[nbias] = b_off[l] + j
                nbias += 1
                if l > 0:
                    starts[nr] = w_off[l] + np.int64(j) * n_in[l]
                    lens[nr] = n_in[l]
                    nr += 1
    return nr, nbias


# ----------------------------------------------------------------------------------------------
# Inference
# ----------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True, fastmath=True, parallel=True)
def hidden_batch_kernel(W, B, n_layers, n_in, n_out, w_off, b_off, X_ptr, X_ind, X_dat,
                        lo, hi, out, scratch):
    """Last hidden layer of rows lo..hi-1 with EVERY neuron active (the exact network).
    ``out`` [hi-lo, n_in[last]]; ``scratch`` [n_chunks, sum of hidden sizes]."""
    n = hi - lo
    last = n_layers - 1
    n_chunks = scratch.shape[0]
    dummy = np.zeros(1, dtype=np.int32)
    for c in prange(n_chunks):
        buf = scratch[c]
        for s in range((c * n) // n_chunks, ((c + 1) * n) // n_chunks):
            r = lo + s
            x_idx = X_ind[X_ptr[r]:X_ptr[r + 1]]
            x_val = X_dat[X_ptr[r]:X_ptr[r + 1]]
            off = 0
            first_forward_dense(W, B, w_off[0], b_off[0], n_out[0], x_idx, x_val,
                                buf[0:n_out[0]])
            for l in range(1, last):
                rows_forward(W, B, w_off[l], b_off[l], n_in[l], True, dummy,
                             buf[off:off + n_in[l]], n_in[l], True, dummy, n_out[l], True,
                             buf[off + n_in[l]:off + n_in[l] + n_out[l]])
                off += n_in[l]
            for i in range(n_in[last]):
                out[s, i] = buf[off + i]


def topk_merge(best_s, best_i, scores, base, k):
    """Running top-k: merge the top-k of ``scores`` (columns offset by ``base``) into
    (best_s, best_i), both [n, k], best first."""
    kk = min(k, scores.shape[1])
    part = np.argpartition(-scores, kk - 1, axis=1)[:, :kk]
    cand_s = np.concatenate([best_s, np.take_along_axis(scores, part, axis=1)], axis=1)
    cand_i = np.concatenate([best_i, part.astype(np.int64) + base], axis=1)
    order = np.argsort(-cand_s, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(cand_s, order, axis=1), np.take_along_axis(cand_i, order, axis=1)


# ----------------------------------------------------------------------------------------------
# Rehash schedule
# ----------------------------------------------------------------------------------------------

class RehashSchedule:
    """When to rehash the LSH tables and rebuild the hash functions (SLIDE paper, sec. 4.2).

    The t-th rehash (t = 0, 1, ...) comes T_t = T_0 * exp(lambda * t) batches after the
    previous one (rounded, at least 1); rebuilds follow the same law with their own T_0
    (``rebuild_period``) and their own counter. lambda = 0 gives fixed periods. A rebuild also
    re-inserts every neuron, so a batch where both are due performs only the rebuild (and
    counts as both). The state (counters and next due batches) is plain ints: saved in
    checkpoints so a resumed run follows the same schedule.
    """

    def __init__(self, rehash_period, rebuild_period, decay):
        self.rehash_period = float(rehash_period)
        self.rebuild_period = float(rebuild_period)
        self.decay = float(decay)
        self.n_rehash = 0
        self.n_rebuild = 0
        self.next_rehash = self.period(self.rehash_period, 0)
        self.next_rebuild = self.period(self.rebuild_period, 0)

    def period(self, base, t):
        return max(1, int(round(base * math.exp(self.decay * t))))

    def periods(self, n, rebuild=False):
        """The first n periods (in batches), for inspection and tests."""
        base = self.rebuild_period if rebuild else self.rehash_period
        return [self.period(base, t) for t in range(n)]

    def step(self, batch):
        """Call after batch number ``batch`` (1-based count of batches trained so far).
        Returns (rehash, rebuild) flags for what is due now."""
        rehash = rebuild = False
        if batch >= self.next_rebuild:
            rebuild = True
            self.n_rebuild += 1
            self.next_rebuild = batch + self.period(self.rebuild_period, self.n_rebuild)
        if batch >= self.next_rehash:
            rehash = True
            self.n_rehash += 1
            self.next_rehash = batch + self.period(self.rehash_period, self.n_rehash)
        return rehash, rebuild

    def state(self):
        return [self.n_rehash, self.n_rebuild, self.next_rehash, self.next_rebuild]

    def set_state(self, st):
        self.n_rehash, self.n_rebuild, self.next_rehash, self.next_rebuild = (int(v) for v in st)


# ----------------------------------------------------------------------------------------------
# Network: owns the arrays and calls the kernels
# ----------------------------------------------------------------------------------------------

def _i64(a):
    return np.ascontiguousarray(a, dtype=np.int64)


class Network:
    """Parameters, gradient buffers and per-fit scratch of one network.

    ``sizes = (n_features, h1, ..., n_labels)``; ``sparse[l]`` says whether layer l selects
    active neurons (LSH sampler or random fill) instead of computing all of them;
    ``min_active[l]`` pads a sparse layer's active set with random neurons.
    """

    def __init__(self, sizes, sparse, min_active, loss="softmax", seed=0, init=True):
        from slide.layers import Layout, init_params
        self.layout = Layout(tuple(int(s) for s in sizes))
        L = self.layout.n_layers
        self.sparse = np.asarray(sparse, dtype=np.bool_).reshape(L)
        self.min_active = _i64(min_active).reshape(L)
        self.loss_code = LOSSES[loss]
        self.seed = int(seed)
        lay = self.layout
        if init:
            self.W, self.B = init_params(lay, self.seed)
        else:
            self.W = np.zeros(lay.n_weights, np.float32)
            self.B = np.zeros(lay.n_biases, np.float32)
        self.GW = np.zeros(lay.n_weights, np.float32)
        self.GB = np.zeros(lay.n_biases, np.float32)
        self.n_in, self.n_out = lay.n_in, lay.n_out
        self.w_off, self.b_off, self.row_off = lay.w_off, lay.b_off, lay.row_off
        self.stamp_rows = np.zeros(int(self.row_off[-1]), np.int64)
        self.stamp_bias = np.zeros(lay.n_biases, np.int64)
        self._scratch_key = None

    # -- capacities --------------------------------------------------------------------------
    def capacity(self, l):
        """Most active neurons layer l can have for one sample."""
        n = int(self.n_out[l])
        if not self.sparse[l]:
            return n
        extra = 0
        return min(n, int(self.min_active[l]) + extra + self._label_cap)

    def prepare(self, batch_size, n_chunks, max_labels):
        """Allocate the per-fit scratch (once; reused while shapes allow)."""
        key = (int(batch_size), int(n_chunks), int(max_labels))
        if self._scratch_key == key:
            return
        self._label_cap = int(max_labels)
        L = self.layout.n_layers
        caps = [self.capacity(l) for l in range(L)]
        self.a_off = _i64(np.concatenate([[0], np.cumsum(caps)]))
        scap = [caps[l] if self.sparse[l] else 0 for l in range(L)]
        self.s_off = _i64(np.concatenate([[0], np.cumsum(scap)]))
        self.acts = np.zeros((n_chunks, int(self.a_off[-1])), np.float32)
        self.dels = np.zeros((n_chunks, int(self.a_off[-1])), np.float32)
        self.ids = np.zeros((batch_size, max(1, int(self.s_off[-1]))), np.int32)
        self.n_act = np.zeros((batch_size, L), np.int64)
        mlen = max([int(self.n_out[l]) for l in range(L) if self.sparse[l]] or [1])
        self.marks = np.zeros((n_chunks, L, mlen), np.int64)
        self.losses = np.zeros(batch_size, np.float64)
        n_rows_total = int(self.row_off[-1])
        self.t_starts = np.zeros(n_rows_total, np.int64)
        self.t_lens = np.zeros(n_rows_total, np.int64)
        self.t_bias = np.zeros(self.layout.n_biases, np.int64)
        self._scratch_key = key

    # -- training ----------------------------------------------------------------------------
    def forward_backward(self, X, Y, rows, seed, serial):
        """Gradients of the batch mean loss into GW/GB (no update). Returns per-sample losses."""
        nb = rows.shape[0]
        train_batch_kernel(self.W, self.B, self.GW, self.GB, self.layout.n_layers, self.n_in,
                           self.n_out, self.w_off, self.b_off, self.a_off, self.s_off,
                           self.sparse, self.min_active, self.loss_code,
                           X.indptr, X.indices, X.data, Y.indptr, Y.indices, rows,
                           np.uint64(seed), np.int64(serial), self.acts, self.dels,
                           self.ids[:nb], self.n_act[:nb], self.marks, self.losses[:nb])
        return self.losses[:nb]

    def touched(self, X, rows, serial):
        nb = rows.shape[0]
        return collect_touched(self.layout.n_layers, self.n_in, self.n_out, self.w_off,
                               self.b_off, self.row_off, self.sparse, self.s_off, X.indptr,
                               X.indices, rows, self.ids[:nb], self.n_act[:nb],
                               self.stamp_rows, self.stamp_bias, np.int64(serial),
                               self.t_starts, self.t_lens, self.t_bias)

    def train_batch(self, X, Y, rows, seed, serial, optimizer):
        """One batch: kernel, touched rows, optimizer step. Returns (mean loss, mean active
        output neurons)."""
        losses = self.forward_backward(X, Y, rows, seed, serial)
        nr, nbias = self.touched(X, rows, serial)
        optimizer.step(self.W, self.B, self.GW, self.GB, self.t_starts, self.t_lens, nr,
                       self.t_bias, nbias)
        nb = rows.shape[0]
        return float(losses.mean()), float(self.n_act[:nb, -1].mean())

    def sample_loss_and_grads(self, x_indices, x_data, labels):
        """Loss and gradients (flat GW, GB) of ONE sample, without updating anything.
        Intended for tests (compare with a dense reference / finite differences)."""
        import scipy.sparse as sp
        n_f = int(self.layout.sizes[0])
        x_indices = np.asarray(x_indices, np.int32)
        X = sp.csr_matrix((np.asarray(x_data, np.float32), x_indices,
                           np.array([0, len(x_indices)])), shape=(1, n_f))
        lab = np.sort(np.asarray(labels, np.int32))
        Y = sp.csr_matrix((np.ones(len(lab), np.float32), lab, np.array([0, len(lab)])),
                          shape=(1, int(self.layout.sizes[-1])))
        self.prepare(1, 1, max(1, len(lab)))
        GW, GB = self.GW, self.GB
        self.GW = np.zeros_like(GW)
        self.GB = np.zeros_like(GB)
        try:
            loss = self.forward_backward(X, Y, np.zeros(1, np.int64), self.seed, 1)[0]
            return float(loss), self.GW, self.GB
        finally:
            self.GW, self.GB = GW, GB

    # -- inference ---------------------------------------------------------------------------
    def hidden(self, X, lo=0, hi=None, n_chunks=None):
        """Last hidden layer (every neuron active) of rows lo..hi-1: float32 [n, h_last]."""
        import numba
        hi = X.shape[0] if hi is None else hi
        L = self.layout.n_layers
        n_chunks = n_chunks or numba.get_num_threads()
        out = np.zeros((hi - lo, int(self.n_in[L - 1])), np.float32)
        scratch = np.zeros((n_chunks, int(sum(self.layout.sizes[1:-1]))), np.float32)
        hidden_batch_kernel(self.W, self.B, L, self.n_in, self.n_out, self.w_off, self.b_off,
                            X.indptr, X.indices, X.data, lo, hi, out, scratch)
        return out

    def output_view(self):
        lay = self.layout
        L = lay.n_layers
        return lay.weight_view(self.W, L - 1), lay.bias_view(self.B, L - 1)

    def predict_topk_exact(self, X, k, block=1024, chunk=32768):
        """Exact top-k over ALL output neurons: hidden layer of a block of samples, then BLAS
        scores against chunks of the output rows with a running top-k."""
        Wo, bo = self.output_view()
        n = X.shape[0]
        n_lab = Wo.shape[0]
        k_eff = min(k, n_lab)
        out = np.zeros((n, k_eff), np.int64)
        for lo in range(0, n, block):
            hi = min(n, lo + block)
            H = self.hidden(X, lo, hi)
            best_s = np.full((hi - lo, 0), -np.inf, np.float32)
            best_i = np.zeros((hi - lo, 0), np.int64)
            for c0 in range(0, n_lab, chunk):
                c1 = min(n_lab, c0 + chunk)
                S = H @ Wo[c0:c1].T
                S += bo[c0:c1]
                best_s, best_i = topk_merge(best_s, best_i, S, c0, k_eff)
            out[lo:hi] = best_i
        return out

    def predict_scores(self, X, block=1024):
        """Dense output scores (logits) [n, n_labels] of the exact network."""
        Wo, bo = self.output_view()
        n = X.shape[0]
        out = np.empty((n, Wo.shape[0]), np.float32)
        for lo in range(0, n, block):
            hi = min(n, lo + block)
            out[lo:hi] = self.hidden(X, lo, hi) @ Wo.T + bo
        return out
