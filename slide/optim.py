"""Sparse optimizers: Adam and SGD over the rows touched by a batch only.

The reference SLIDE updates every weight of every layer after every batch, which at 670k
labels is most of its running time. Here the batch kernel leaves the gradient of the batch in
shared buffers ``G`` (zero everywhere else), the engine lists the touched rows once
(deduplicated), and these kernels visit only those rows, in parallel, and zero their gradient
afterwards so the buffers are all-zero again between batches.

Adam semantics. ``"adam"`` (the default) gives every row the trajectory of *dense* Adam, as
TensorFlow and PyTorch apply it, at sparse cost: in a batch that does not touch a row, dense Adam
still moves it by its decaying momentum (``m <- beta1 m``, ``v <- beta2 v``,
``w -= lr m / sqrt(v)``). Those zero-gradient steps have a closed form -- after a row's last
touch at step s, the steps s+1..s+n move it by ``lr * m_s / sqrt(v_s) * sum_{j=1..n} r^j`` with
``r = beta1 / sqrt(beta2)`` -- so each row records the step of its last update (``T``) and the
next touch (or ``flush``, before inference) applies the missed steps at once. This matters
for extreme classification: a label seen once in an epoch gets about ten times the push of one
lazy step (the momentum keeps acting), which is how a dense network learns rare labels within
one epoch. Approximations: the missed steps use the current bias-corrected step size and
ignore epsilon's effect on the decayed ``v``.
``"lazy_adam"`` (TensorFlow's ``LazyAdamOptimizer``, PyTorch's ``SparseAdam``): a row's moments
decay only in the batches that touch it, and untouched rows do not move at all.
Both use the global step count ``t`` for the bias correction. A row is a layer-0 input feature
(all its n_hidden weights) or a neuron of a later layer (its incoming weights and its bias).
"""
from typing import NamedTuple

import numpy as np
from numba import njit, prange

from slide.layers import FASTMATH

OPTIMIZERS = {"adam": 0, "sgd": 1, "lazy_adam": 2}
KIND_ADAM, KIND_SGD = 0, 1          # output_step's update rule


class Moments(NamedTuple):
    """Adam state of a block of parameters: moments of the weights (MW, VW) and biases (MB,
    VB), and the step of each row's / bias's last update (TW, TB; empty: no catch-up)."""
    MW: np.ndarray
    VW: np.ndarray
    MB: np.ndarray
    VB: np.ndarray
    TW: np.ndarray
    TB: np.ndarray


class Hyper(NamedTuple):
    """One step's settings: bias-corrected step size ``lr_t`` (plain lr for SGD), Adam's betas
    and epsilon, and the global step count ``t``."""
    lr_t: float
    beta1: float
    beta2: float
    eps: float
    t: int


def adam_lr(learning_rate, beta1, beta2, t):
    """Bias-corrected step size of Adam at step ``t`` (1-based)."""
    return learning_rate * np.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t)


@njit(cache=True, nogil=True, inline="always")
def _consts(hyper):
    """The float32 constants of the Adam update: (b1, b2, 1 - b1, 1 - b2, lr_t, eps)."""
    return (np.float32(hyper.beta1), np.float32(hyper.beta2), np.float32(1.0 - hyper.beta1),
            np.float32(1.0 - hyper.beta2), np.float32(hyper.lr_t), np.float32(hyper.eps))


@njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def _adam_row(w, mm, vv, gg, k, fused_output):
    """THE Adam update (every path uses it), in place on a row: w, its moments mm, vv, its
    gradient gg; ``k`` = ``_consts(hyper)``. A single parameter is a row of length 1.

    ``fused_output`` (a constant at each call site) only selects between two spellings of the
    same formula that the engine has always used: the output layer's fused step reads g[i]
    twice, the buffered layers read it once. Under fastmath the two compile to differently
    contracted multiply-adds and differ in the last bit, and tests/test_golden.py pins the
    trajectories bit for bit; using one spelling everywhere is a deliberate, separately
    reviewed change (regenerate the fixture with tests/make_golden.py)."""
    b1, b2, c1, c2, lr, ep = k
    for i in range(w.shape[0]):
        if fused_output:
            m = b1 * mm[i] + c1 * gg[i]
            v = b2 * vv[i] + c2 * gg[i] * gg[i]
        else:
            g = gg[i]
            m = b1 * mm[i] + c1 * g
            v = b2 * vv[i] + c2 * g * g
        mm[i] = m
        vv[i] = v
        w[i] -= lr * m / (np.sqrt(v) + ep)


@njit(cache=True, nogil=True, inline="always")
def _missed_steps(last, t, beta1, beta2):
    """Closed form of the zero-gradient Adam steps a row updated at step ``last`` missed before
    step ``t`` (steps last+1 .. t-1): (sum of r^j, beta1^n, beta2^n, n)."""
    n = t - 1 - last
    if last <= 0 or n <= 0:
        return 0.0, 1.0, 1.0, 0
    r = beta1 / np.sqrt(beta2)
    return r * (1.0 - r ** n) / (1.0 - r), beta1 ** n, beta2 ** n, n


@njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def _catch_up(w, mm, vv, last, t, hyper):
    """Apply to one row the zero-gradient steps it missed between steps ``last`` and ``t``."""
    srt, d1, d2, n = _missed_steps(last, t, hyper.beta1, hyper.beta2)
    if n == 0:
        return
    lrs = np.float32(hyper.lr_t * srt)
    f1 = np.float32(d1)
    f2 = np.float32(d2)
    ep = np.float32(hyper.eps)
    for i in range(w.shape[0]):
        m = mm[i]
        v = vv[i]
        w[i] -= lrs * m / (np.sqrt(v) + ep)
        mm[i] = m * f1
        vv[i] = v * f2


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True)
def adam_rows(W, M, V, G, T, starts, lens, rowids, n, hyper):
    """Adam on the rows ``W[starts[i]:starts[i]+lens[i]]`` for i < n; zeroes their gradient.
    With a step record ``T`` (non-empty), first the zero-gradient steps each row missed since
    ``T[rowids[i]]``, then ``T[rowids[i]] = t``."""
    k = _consts(hyper)
    for r in prange(n):
        s = starts[r]
        e = s + lens[r]
        if T.shape[0] > 0:
            _catch_up(W[s:e], M[s:e], V[s:e], T[rowids[r]], hyper.t, hyper)
            T[rowids[r]] = hyper.t
        _adam_row(W[s:e], M[s:e], V[s:e], G[s:e], k, False)
        G[s:e] = 0.0


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True)
def adam_ids(B, M, V, G, T, ids, n, hyper):
    """Adam on the single entries ``B[ids[i]]`` for i < n (biases); zeroes their gradient.
    With a step record ``T`` (non-empty), missed steps first, as in ``adam_rows``."""
    k = _consts(hyper)
    for r in prange(n):
        e = ids[r]
        if T.shape[0] > 0:
            _catch_up(B[e:e + 1], M[e:e + 1], V[e:e + 1], T[e], hyper.t, hyper)
            T[e] = hyper.t
        _adam_row(B[e:e + 1], M[e:e + 1], V[e:e + 1], G[e:e + 1], k, False)
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


@njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def _row_gradient(u, out_rows, store, g):
    """g = gradient of unique output row u: the sum over its (sample s, slot k) entries of
    d_store[s, k] * h_store[s], in entry order. Returns the bias gradient."""
    d_cap = store.d_store.shape[1]
    n_in = store.h_store.shape[1]
    for i in range(n_in):
        g[i] = 0.0
    gb = np.float32(0.0)
    for e in range(out_rows.row_ptr[u], out_rows.row_ptr[u + 1]):
        p = out_rows.ent[e]
        s = p // d_cap
        d = store.d_store[s, p - s * d_cap]
        gb += d
        h = store.h_store[s]
        for i in range(n_in):
            g[i] += d * h[i]
    return gb


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True, error_model="numpy")
def output_step(W, B, mom, hyper, kind, w_off, b_off, out_rows, n_uniq, store):
    """Gradient and update of the sampled output layer, one unique active row at a time.

    Row j's gradient is formed here, race-free and in a fixed order, from the per-sample deltas
    the batch kernel stored (``store``: h_store[s] = the layer's input for sample s, d_store
    its deltas; ``out_rows``: the per-row entry lists of ``slide.engine.touched``). It is
    applied at once (Adam, kind KIND_ADAM, or SGD with step hyper.lr_t), so the output layer
    needs no gradient buffer at all (343 MB saved at Amazon-670K) and each of its touched rows
    is read and written once per batch. Rows are dealt to threads round-robin: the rows every
    sample shares (labels of frequent classes, the batch's shared negatives) come first in
    ``uniq`` and would otherwise all land on one thread. Non-empty ``mom.TW``/``mom.TB`` (the
    layer's slices of the step records): the missed zero-gradient steps first."""
    # bundle members are taken out before the prange: Numba 0.68's parfor lowering drops a
    # store written directly through a tuple attribute (``mom.TW[j] = t``) inside the loop
    MW, VW, MB, VB, TW, TB = mom
    g_out, uniq = out_rows.g_out, out_rows.uniq
    n_in = store.h_store.shape[1]
    n_chunks = g_out.shape[0]
    k = _consts(hyper)
    lr = np.float32(hyper.lr_t)
    t = hyper.t
    for c in prange(n_chunks):
        g = g_out[c]
        for u in range(c, n_uniq, n_chunks):
            j = uniq[u]
            gb = _row_gradient(u, out_rows, store, g)
            base = w_off + np.int64(j) * n_in
            w = W[base:base + n_in]
            e = b_off + j
            if kind == KIND_ADAM:
                mw = MW[base:base + n_in]
                vw = VW[base:base + n_in]
                if TW.shape[0] > 0:
                    _catch_up(w, mw, vw, TW[j], t, hyper)
                    _catch_up(B[e:e + 1], MB[e:e + 1], VB[e:e + 1], TB[j], t, hyper)
                    TW[j] = t
                    TB[j] = t
                _adam_row(w, mw, vw, g[:n_in], k, True)
                g[n_in] = gb
                _adam_row(B[e:e + 1], MB[e:e + 1], VB[e:e + 1], g[n_in:], k, False)
            else:
                for i in range(n_in):
                    w[i] -= lr * g[i]
                B[e] -= lr * gb


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True)
def adam_flush_rows(W, M, V, T, w_base, n_rows, row_len, hyper):
    """Bring every row of one layer block (row i at ``w_base + i * row_len``, record ``T[i]``)
    to the end of step ``hyper.t``: the zero-gradient steps after its last update, up to and
    including step t."""
    t = hyper.t
    for r in prange(n_rows):
        last = T[r]
        if 0 < last < t:
            s = w_base + np.int64(r) * row_len
            e = s + row_len
            _catch_up(W[s:e], M[s:e], V[s:e], last, t + 1, hyper)
            T[r] = t


class SparseOptimizer:
    """Owns the optimizer state (moments, step records, step count) of a network's flat
    parameters (``layout``: ``slide.layers.Layout``).

    ``step(...)`` applies one update to the touched rows and biases listed by the engine;
    ``flush()`` brings every row up to date (``"adam"`` only; a no-op otherwise) and must run
    before the weights are used for inference.
    """

    def __init__(self, kind, layout, learning_rate, beta1=0.9, beta2=0.999, epsilon=1e-8):
        if kind not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)}, got {kind!r}")
        self.kind = kind
        self.layout = layout
        self.learning_rate = float(learning_rate)
        self.beta1 = float(beta1)
        self.beta2 = float(beta2)
        self.epsilon = float(epsilon)
        self.t = 0
        n_weights, n_biases = layout.n_weights, layout.n_biases
        if kind in ("adam", "lazy_adam"):
            self.MW = np.zeros(n_weights, dtype=np.float32)
            self.VW = np.zeros(n_weights, dtype=np.float32)
            self.MB = np.zeros(n_biases, dtype=np.float32)
            self.VB = np.zeros(n_biases, dtype=np.float32)
        else:
            self.MW = self.VW = np.zeros(0, dtype=np.float32)
            self.MB = self.VB = np.zeros(0, dtype=np.float32)
        # step of each row's / bias's last update (0: never); empty: no catch-up
        if kind == "adam":
            self.TW = np.zeros(int(layout.row_off[-1]), dtype=np.int32)
            self.TB = np.zeros(n_biases, dtype=np.int32)
        else:
            self.TW = np.zeros(0, dtype=np.int32)
            self.TB = np.zeros(0, dtype=np.int32)

    @property
    def _adam(self):
        return self.kind != "sgd"

    @property
    def moments(self):
        return Moments(self.MW, self.VW, self.MB, self.VB, self.TW, self.TB)

    def _hyper(self):
        lr_t = adam_lr(self.learning_rate, self.beta1, self.beta2, max(self.t, 1))
        return Hyper(float(lr_t), self.beta1, self.beta2, self.epsilon, int(self.t))

    def step(self, params, touched, n_rows, n_bias):
        """One step on the rows and biases a batch touched: ``params`` (W, B, GW, GB) and
        ``touched`` (starts, lens, rowids, bias_ids) are ``slide.engine.arrays`` bundles;
        the first ``n_rows`` / ``n_bias`` entries are used."""
        self.t += 1
        W, B, GW, GB = params.W, params.B, params.GW, params.GB
        if self._adam:
            h = self._hyper()
            adam_rows(W, self.MW, self.VW, GW, self.TW, touched.starts, touched.lens,
                      touched.rowids, n_rows, h)
            adam_ids(B, self.MB, self.VB, GB, self.TB, touched.bias_ids, n_bias, h)
        else:
            sgd_rows(W, GW, touched.starts, touched.lens, n_rows, self.learning_rate)
            sgd_ids(B, GB, touched.bias_ids, n_bias, self.learning_rate)

    def step_output(self, W, B, out_rows, n_uniq, store):
        """The sampled output layer's fused gradient + update (call after ``step`` of the same
        batch: it uses the same step count)."""
        lay = self.layout
        last = lay.n_layers - 1
        mom = self.moments
        if mom.TW.shape[0]:
            mom = mom._replace(TW=self.TW[int(lay.row_off[last]):int(lay.row_off[last + 1])],
                               TB=self.TB[int(lay.b_off[last]):int(lay.b_off[last + 1])])
        if self._adam:
            h, kind = self._hyper(), KIND_ADAM
        else:
            h, kind = Hyper(self.learning_rate, self.beta1, self.beta2, self.epsilon,
                            int(self.t)), KIND_SGD
        output_step(W, B, mom, h, kind, int(lay.w_off[last]), int(lay.b_off[last]), out_rows,
                    n_uniq, store)

    @property
    def pending(self):
        """Whether some row has not received the zero-gradient steps since its last update."""
        return bool(self.TW.shape[0]) and self.t > 0 and (
            bool((self.TW[self.TW > 0] < self.t).any()) or
            bool((self.TB[self.TB > 0] < self.t).any()))

    def flush(self, W, B):
        """Apply every row's missed zero-gradient steps up to the current step (after it, W
        and B are what dense Adam would hold). Deterministic; idempotent."""
        if not self.TW.shape[0] or self.t == 0:
            return
        lay = self.layout
        h = self._hyper()
        for l in range(lay.n_layers):
            r0, r1 = int(lay.row_off[l]), int(lay.row_off[l + 1])
            adam_flush_rows(W, self.MW, self.VW, self.TW[r0:r1], int(lay.w_off[l]), r1 - r0,
                            int(lay.row_len[l]), h)
        adam_flush_rows(B, self.MB, self.VB, self.TB, 0, lay.n_biases, 1, h)

    def state_arrays(self):
        return {"opt_MW": self.MW, "opt_VW": self.VW, "opt_MB": self.MB, "opt_VB": self.VB,
                "opt_TW": self.TW, "opt_TB": self.TB}

    # -- state ----------------------------------------------------------------------------------
    def state_dict(self):
        """{"meta": JSON-able settings and step count, "arrays": the moments and step records
        (copies)}. ``SparseOptimizer.from_state(layout, state)`` rebuilds an optimizer that
        continues exactly."""
        meta = {"kind": self.kind, "learning_rate": self.learning_rate, "beta1": self.beta1,
                "beta2": self.beta2, "epsilon": self.epsilon, "t": int(self.t)}
        return {"meta": meta, "arrays": {k: v.copy() for k, v in self.state_arrays().items()}}

    @classmethod
    def from_state(cls, layout, state):
        """The optimizer of :meth:`state_dict`'s output; raises ValueError naming the first
        entry that is missing or does not fit ``layout``."""
        if not isinstance(state, dict) or "meta" not in state or "arrays" not in state:
            raise ValueError("optimizer state must be a dict with 'meta' and 'arrays'")
        meta, arrays = state["meta"], state["arrays"]
        need = ("kind", "learning_rate", "beta1", "beta2", "epsilon", "t")
        missing = [k for k in need if k not in meta]
        if missing:
            raise ValueError(f"optimizer state meta lacks {missing}")
        opt = cls(meta["kind"], layout, meta["learning_rate"], meta["beta1"], meta["beta2"],
                  meta["epsilon"])
        t = meta["t"]
        if not isinstance(t, (int, np.integer)) or isinstance(t, bool) or t < 0:
            raise ValueError(f"optimizer state: t must be a non-negative integer, got {t!r}")
        opt.t = int(t)
        for name, target in opt.state_arrays().items():
            if name not in arrays:
                raise ValueError(f"optimizer state lacks array {name!r}")
            a = np.asarray(arrays[name])
            if a.shape != target.shape or a.dtype != target.dtype:
                raise ValueError(f"optimizer state: {name!r} has shape {a.shape} and dtype "
                                 f"{a.dtype}, expected {target.shape} {target.dtype}")
            target[...] = a
        return opt
