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

OPTIMIZERS = {"adam": 0, "sgd": 1}


def adam_lr(learning_rate, beta1, beta2, t):
    """Bias-corrected step size of Adam at step ``t`` (1-based)."""
    return learning_rate * np.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t)


@njit(cache=True, nogil=True, fastmath=True, parallel=True)
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
        for e in range(s, s + lens[r]):
            g = G[e]
            m = b1 * M[e] + c1 * g
            v = b2 * V[e] + c2 * g * g
            M[e] = m
            V[e] = v
            W[e] -= lr * m / (np.sqrt(v) + ep)
            G[e] = 0.0


@njit(cache=True, nogil=True, fastmath=True, parallel=True)
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


@njit(cache=True, nogil=True, fastmath=True, parallel=True)
def sgd_rows(W, G, starts, lens, n, lr):
    """Plain SGD on the touched rows; zeroes their gradient."""
    lr32 = np.float32(lr)
    for r in prange(n):
        s = starts[r]
        for e in range(s, s + lens[r]):
            W[e] -= lr32 * G[e]
            G[e] = 0.0


@njit(cache=True, nogil=True, fastmath=True, parallel=True)
def sgd_ids(B, G, ids, n, lr):
    lr32 = np.float32(lr)
    for r in prange(n):
        e = ids[r]
        B[e] -= lr32 * G[e]
        G[e] = 0.0


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

    def state_arrays(self):
        return {"opt_MW": self.MW, "opt_VW": self.VW, "opt_MB": self.MB, "opt_VB": self.VB}
