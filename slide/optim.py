"""Sparse optimizers: Adam and SGD over the rows touched by a batch only.

The reference SLIDE updates every weight of every layer after every batch, which at 670k
labels is most of its running time. Here the batch kernel leaves the gradient of the batch in
shared buffers ``G`` (zero everywhere else), the engine lists the touched rows once
(deduplicated), and these kernels visit only those rows, in parallel, and zero their gradient
afterwards so the buffers are all-zero again between batches.

Adam semantics ("lazy" Adam, as TensorFlow's ``LazyAdamOptimizer`` / PyTorch's ``SparseAdam``):
the first and second moments of a row decay only in the batches that touch the row; the bias
correction uses the global step count ``t`` (number of optimizer steps so far). For a row touched
in every batch this is exactly Adam; for a rarely touched label it avoids the momentum-only
drift that dense Adam applies to rows whose gradient is zero, and it costs nothing for them.
A row is a layer-0 input feature (all its n_hidden weights) or a neuron of a later layer (its
incoming weights and its bias).
"""
import numpy as np
from numba import njit, prange

from slide.layers import FASTMATH

OPTIMIZERS = {"adam": 0, "sgd": 1}


def adam_lr(learning_rate, beta1, beta2, t):
    """Bias-corrected step size of Adam at step ``t`` (1-based)."""
    return learning_rate * np.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t)


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True)
def adam_rows(W, M, V, G, starts, lens, n, lr_t, beta1, beta2, eps):
    """Adam on the rows ``W[starts[i]:starts[i]+lens[i]]`` for i < n; zeroes their gradient."""
    b1 = np.float32(beta1)
    b2 = np.float32(beta2)
    c1 = np.float32(1.0 - beta1)
    c2 = np.float32(1.0 - beta2)
    lr = np.float32(lr_t)
    ep = np.float32(eps)
    for r in prange(n):
        s = starts[r]
        e = s + lens[r]
        w = W[s:e]
        mm = M[s:e]
        vv = V[s:e]
        gg = G[s:e]
        for i in range(e - s):
            g = gg[i]
            m = b1 * mm[i] + c1 * g
            v = b2 * vv[i] + c2 * g * g
            mm[i] = m
            vv[i] = v
            w[i] -= lr * m / (np.sqrt(v) + ep)
            gg[i] = 0.0


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True)
def adam_ids(B, M, V, G, ids, n, lr_t, beta1, beta2, eps):
    """Adam on the single entries ``B[ids[i]]`` for i < n (biases); zeroes their gradient."""
    b1 = np.float32(beta1)
    b2 = np.float32(beta2)
    c1 = np.float32(1.0 - beta1)
    c2 = np.float32(1.0 - beta2)
    lr = np.float32(lr_t)
    ep = np.float32(eps)
    for r in prange(n):
        e = ids[r]
        g = G[e]
        m = b1 * M[e] + c1 * g
        v = b2 * V[e] + c2 * g * g
        M[e] = m
        V[e] = v
        B[e] -= lr * m / (np.sqrt(v) + ep)
        G[e] = 0.0


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True)
def sgd_rows(W, G, starts, lens, n, lr):
    """Plain SGD on the touched rows; zeroes their gradient."""
    lr32 = np.float32(lr)
    for r in prange(n):
        s = starts[r]
        for e in range(s, s + lens[r]):
            W[e] -= lr32 * G[e]
            G[e] = 0.0


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True)
def sgd_ids(B, G, ids, n, lr):
    lr32 = np.float32(lr)
    for r in prange(n):
        e = ids[r]
        B[e] -= lr32 * G[e]
        G[e] = 0.0


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True, error_model="numpy")
def output_step(W, B, MW, VW, MB, VB, w_off, b_off, n_in, uniq, n_uniq, row_ptr, ent,
                d_store, h_store, kind, lr_t, beta1, beta2, eps, scratch):
    """Gradient and update of the sampled output layer, one unique active row at a time.

    Row j's gradient is formed here, race-free and in a fixed order, from the per-sample deltas
    the batch kernel stored: g_j = sum over its (sample s, slot k) entries of
    d_store[s, k] * h_store[s] (h_store[s] = the layer's input for sample s). It is applied at
    once (Adam, kind 0, or SGD, kind 1), so the output layer needs no gradient buffer at all
    (343 MB saved at Amazon-670K) and each of its touched rows is read and written once per
    batch. Rows are dealt to threads round-robin: the rows every sample shares (labels of
    frequent classes, the batch's shared negatives) come first in ``uniq`` and would otherwise
    all land on one thread."""
    d_cap = d_store.shape[1]
    n_chunks = scratch.shape[0]
    b1 = np.float32(beta1)
    b2 = np.float32(beta2)
    c1 = np.float32(1.0 - beta1)
    c2 = np.float32(1.0 - beta2)
    lr = np.float32(lr_t)
    ep = np.float32(eps)
    for c in prange(n_chunks):
        g = scratch[c]
        for u in range(c, n_uniq, n_chunks):
            j = uniq[u]
            for i in range(n_in):
                g[i] = 0.0
            gb = np.float32(0.0)
            for e in range(row_ptr[u], row_ptr[u + 1]):
                p = ent[e]
                s = p // d_cap
                d = d_store[s, p - s * d_cap]
                gb += d
                h = h_store[s]
                for i in range(n_in):
                    g[i] += d * h[i]
            base = w_off + np.int64(j) * n_in
            if kind == 0:
                w = W[base:base + n_in]
                mw = MW[base:base + n_in]
                vw = VW[base:base + n_in]
                for i in range(n_in):
                    m = b1 * mw[i] + c1 * g[i]
                    v = b2 * vw[i] + c2 * g[i] * g[i]
                    mw[i] = m
                    vw[i] = v
                    w[i] -= lr * m / (np.sqrt(v) + ep)
                e = b_off + j
                m = b1 * MB[e] + c1 * gb
                v = b2 * VB[e] + c2 * gb * gb
                MB[e] = m
                VB[e] = v
                B[e] -= lr * m / (np.sqrt(v) + ep)
            else:
                w = W[base:base + n_in]
                for i in range(n_in):
                    w[i] -= lr * g[i]
                B[b_off + j] -= lr * gb


class SparseOptimizer:
    """Owns the optimizer state (moments, step count) of a flat parameter set.

    ``step(...)`` applies one update to the touched rows and biases listed by the engine.
    """

    def __init__(self, kind, n_weights, n_biases, learning_rate, beta1=0.9, beta2=0.999,
                 epsilon=1e-8):
        if kind not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)}, got {kind!r}")
        self.kind = kind
        self.learning_rate = float(learning_rate)
        self.beta1 = float(beta1)
        self.beta2 = float(beta2)
        self.epsilon = float(epsilon)
        self.t = 0
        if kind == "adam":
            self.MW = np.zeros(n_weights, dtype=np.float32)
            self.VW = np.zeros(n_weights, dtype=np.float32)
            self.MB = np.zeros(n_biases, dtype=np.float32)
            self.VB = np.zeros(n_biases, dtype=np.float32)
        else:
            self.MW = self.VW = np.zeros(0, dtype=np.float32)
            self.MB = self.VB = np.zeros(0, dtype=np.float32)

    def step(self, W, B, GW, GB, starts, lens, n_rows, bias_ids, n_bias):
        self.t += 1
        if self.kind == "adam":
            lr_t = adam_lr(self.learning_rate, self.beta1, self.beta2, self.t)
            adam_rows(W, self.MW, self.VW, GW, starts, lens, n_rows, lr_t,
                      self.beta1, self.beta2, self.epsilon)
            adam_ids(B, self.MB, self.VB, GB, bias_ids, n_bias, lr_t,
                     self.beta1, self.beta2, self.epsilon)
        else:
            sgd_rows(W, GW, starts, lens, n_rows, self.learning_rate)
            sgd_ids(B, GB, bias_ids, n_bias, self.learning_rate)

    def step_output(self, W, B, w_off, b_off, n_in, uniq, n_uniq, row_ptr, ent, d_store,
                    h_store, scratch):
        """The sampled output layer's fused gradient + update (call after ``step`` of the same
        batch: it uses the same step count)."""
        if self.kind == "adam":
            lr_t = adam_lr(self.learning_rate, self.beta1, self.beta2, self.t)
            kind = 0
        else:
            lr_t = self.learning_rate
            kind = 1
        output_step(W, B, self.MW, self.VW, self.MB, self.VB, w_off, b_off, n_in, uniq,
                    n_uniq, row_ptr, ent, d_store, h_store, kind, lr_t, self.beta1,
                    self.beta2, self.epsilon, scratch)

    def state_arrays(self):
        return {"opt_MW": self.MW, "opt_VW": self.VW, "opt_MB": self.MB, "opt_VB": self.VB}
