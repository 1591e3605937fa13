"""Sparse optimizers: Adam and SGD over the rows touched by a batch only.

The reference SLIDE updates every weight of every layer after every batch, which at 670k
labels is most of its running time. Here the batch kernel leaves the gradient of the batch in
shared buffers ``G`` (zero everywhere else), the engine lists the touched rows once
(deduplicated), and these kernels visit only those rows, in parallel, and zero their gradient
afterwards so the buffers are all-zero again between batches.

Adam semantics. ``"adam"`` (the default) gives every row the trajectory of *dense* Adam, as
TensorFlow and PyTorch apply it, at sparse cost: in a batch that does not touch a row, dense Adam
still moves it by its decaying momentum (``m <- beta1 m``, ``v <- beta2 v``,
``w -= c_k m / sqrt(v)``, where ``c_k = lr_k sqrt(1 - beta2^k) / (1 - beta1^k)`` is step k's
bias-corrected rate under the learning-rate schedule). Those zero-gradient steps have a closed
form -- after a row's last touch at step s, step k > s moves it by
``c_k r^(k-s) m_s / sqrt(v_s)`` with ``r = beta1 / sqrt(beta2)`` -- so each row records the
step of its last update (``T``) and its next touch (or ``flush``, before inference) applies
the missed steps at once: ``m_s / sqrt(v_s) * sum_k c_k r^(k-s)``.

The optimizer records every step's ``c_k`` (``SparseOptimizer.step_rates``: a float64 table
indexed by step, part of its state and of every checkpoint) and, per block of ``RATE_BLOCK``
steps, the discounted prefix sums ``P[k] = sum_{i=block start..k} c_i r^(i - block start)``,
so a row's sum costs a few block lookups whatever its idle gap (``discounted_rate_sum``: the
blocks after the first step whose weight ``r^(k-s)`` is below ``TAIL_WEIGHT`` (1e-16) are
dropped; what they would add is below ``1e-16 * max_k c_k / (1 - r)``, at the default betas
after 351 steps, so at most 7 blocks). The catch-up is therefore dense Adam's trajectory
under any schedule, up to float rounding and one approximation: epsilon is added to the row's
``sqrt(v_s)`` rather than to each missed step's decayed ``sqrt(beta2^j v_s)`` (negligible
unless ``v`` is of the order of ``eps^2``). A row's momentum keeps acting after its last
touch, which matters for extreme classification: a label seen once in an epoch gets about ten
times the push of one lazy step, which is how a dense network learns rare labels within one
epoch.
``"lazy_adam"`` (TensorFlow's ``LazyAdamOptimizer``, PyTorch's ``SparseAdam``): a row's moments
decay only in the batches that touch it, and untouched rows do not move at all.
Both use the global step count ``t`` for the bias correction. A row is a layer-0 input feature
(all its n_hidden weights) or a neuron of a later layer (its incoming weights and its bias).
"""
from typing import NamedTuple

import numpy as np
from numba import njit, prange

from slide.kernels.layers import FASTMATH


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
    and epsilon, the global step count ``t``, and the record of every step's rate:
    ``rates[k]`` = c_k for k <= t and its discounted block prefix sums ``rate_sums``
    (``extend_rate_sums``), from which the catch-up takes the missed steps' rates."""
    lr_t: float
    beta1: float
    beta2: float
    eps: float
    t: int
    rates: np.ndarray
    rate_sums: np.ndarray


def adam_lr(learning_rate, beta1, beta2, t):
    """Bias-corrected step size of Adam at step ``t`` (1-based)."""
    return learning_rate * np.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t)


# the discounted prefix sums of the step rates restart every RATE_BLOCK steps, so a sum over
# a block is one subtraction and its weight r^(block start - s) stays in float64's range
RATE_BLOCK = 64
# the catch-up drops the blocks after the first step whose weight r^(k-s) is below this
# (module docstring: the bound of what they would add)
TAIL_WEIGHT = 1e-16


def block_powers(beta1, beta2):
    """r^j for j < RATE_BLOCK (float64; r = beta1 / sqrt(beta2)), the weights inside a block
    of prefix sums."""
    r = float(beta1) / float(np.sqrt(float(beta2)))
    return np.array([r ** j for j in range(RATE_BLOCK)], np.float64)


@njit(cache=True, nogil=True)
def extend_rate_sums(rates, sums, powers, lo, hi):
    """sums[k] for lo <= k < hi from rates[k] and sums[k - 1]: the discounted prefix sums
    ``sums[k] = sum_{i=b..k} rates[i] * r^(i-b)`` of k's block (b = its first step). The one
    writer of them (no fastmath), step by step during training and all at once when a saved
    state is loaded, so both give the same bits."""
    for k in range(lo, hi):
        j = k % RATE_BLOCK
        if j == 0:
            sums[k] = rates[k]
        else:
            sums[k] = sums[k - 1] + rates[k] * powers[j]


@njit(cache=True, nogil=True)
def discounted_rate_sum(sums, s, e, r):
    """sum_{k=s+1..e} c_k r^(k-s) (e > s) from the block prefix sums ``sums`` of the rates c:
    one subtraction per block of RATE_BLOCK steps, stopping after the first block whose next
    step's weight r^(k-s) is below TAIL_WEIGHT, so a row idle for any number of steps costs a
    few blocks. Not fastmath: the difference of two prefix sums is the delicate part (its
    relative error is ~1e-16 * r^-RATE_BLOCK / (1 - r), ~1e-12, far below float32's)."""
    total = 0.0
    k = s + 1
    while k <= e:
        b = (k // RATE_BLOCK) * RATE_BLOCK
        hi = min(e, b + RATE_BLOCK - 1)
        part = sums[hi] if k == b else sums[hi] - sums[k - 1]
        total += part * r ** (b - s)
        k = hi + 1
        if r ** (k - s) < TAIL_WEIGHT:
            break
    return total


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
def _missed_steps(last, t, hyper):
    """Closed form of the zero-gradient Adam steps a row updated at step ``last`` missed before
    step ``t`` (steps last+1 .. t-1): (sum of c_k r^(k-last) over them, beta1^n, beta2^n, n)."""
    n = t - 1 - last
    if last <= 0 or n <= 0:
        return 0.0, 1.0, 1.0, 0
    r = hyper.beta1 / np.sqrt(hyper.beta2)
    return (discounted_rate_sum(hyper.rate_sums, last, t - 1, r), hyper.beta1 ** n,
            hyper.beta2 ** n, n)


@njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def _catch_up(w, mm, vv, last, t, hyper):
    """Apply to one row the zero-gradient steps it missed between steps ``last`` and ``t``,
    each at its own recorded rate (``hyper.rate_sums``)."""
    srt, d1, d2, n = _missed_steps(last, t, hyper)
    if n == 0:
        return
    lrs = np.float32(srt)
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
    its deltas; ``out_rows``: the per-row entry lists of ``slide.kernels.touched``). It is
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
    for c in prange(n_chunks):
        g = g_out[c]
        for u in range(c, n_uniq, n_chunks):
            j = uniq[u]
            g[n_in] = _row_gradient(u, out_rows, store, g)
            _output_row_step(W, B, MW, VW, MB, VB, TW, TB, w_off + np.int64(j) * n_in,
                             b_off + j, j, g[:n_in], g[n_in:], hyper, kind)


@njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def _output_row_step(W, B, MW, VW, MB, VB, TW, TB, base, e, j, g, gb, hyper, kind):
    """One output neuron's update from its gradient: row ``W[base:base+len(g)]`` gets ``g``,
    bias ``B[e]`` gets ``gb[0]``; Adam (after the missed steps, when the layer's step records
    ``TW``/``TB`` are not empty) or SGD at the step ``hyper`` describes. (Inlined into the
    row loops: the constants derived from ``hyper`` here are hoisted out of them.)"""
    k = _consts(hyper)
    lr = np.float32(hyper.lr_t)
    t = hyper.t
    n_in = g.shape[0]
    w = W[base:base + n_in]
    if kind == KIND_ADAM:
        mw = MW[base:base + n_in]
        vw = VW[base:base + n_in]
        if TW.shape[0] > 0:
            _catch_up(w, mw, vw, TW[j], t, hyper)
            _catch_up(B[e:e + 1], MB[e:e + 1], VB[e:e + 1], TB[j], t, hyper)
            TW[j] = t
            TB[j] = t
        _adam_row(w, mw, vw, g, k, True)
        _adam_row(B[e:e + 1], MB[e:e + 1], VB[e:e + 1], gb, k, False)
    else:
        for i in range(n_in):
            w[i] -= lr * g[i]
        B[e] -= lr * gb[0]


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True, error_model="numpy")
def block_step(W, B, mom, hyper, kind, w_off, b_off, rows, dW, db, stamp, serial):
    """The update of the output rows ``rows`` (distinct) from their batch gradient ``dW[i]``
    / ``db[i]`` (the batched engine's shared block, ``slide.network.block``): as
    ``output_step`` does for one row, in parallel over rows; ``stamp[j] = serial`` records the
    update for the incremental rehash."""
    MW, VW, MB, VB, TW, TB = mom
    n_in = dW.shape[1]
    for i in prange(rows.shape[0]):
        j = rows[i]
        stamp[j] = serial
        _output_row_step(W, B, MW, VW, MB, VB, TW, TB, w_off + np.int64(j) * n_in, b_off + j,
                         j, dW[i], db[i:i + 1], hyper, kind)


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
    """Owns the optimizer state (moments, step records, step count, the rate of every step)
    of a network's flat parameters (``layout``: ``slide.kernels.layers.Layout``).

    ``step(...)`` applies one update to the touched rows and biases listed by the engine at
    the current ``learning_rate`` (the trainer sets it before each batch); ``flush()`` brings
    every row up to date (``"adam"`` only; a no-op otherwise) and must run before the weights
    are used for inference. ``step_rates`` records every step's rate (Adam: bias-corrected),
    which the catch-up reads: it is state, saved with the moments.
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
        # the rate of every step so far (index = step, entry 0 unused; grown by doubling) and
        # its block prefix sums, which the catch-up kernels read through Hyper
        self._powers = block_powers(self.beta1, self.beta2)
        self._t = 0
        self._rates = np.zeros(RATE_BLOCK, np.float64)
        self._rate_sums = np.zeros(RATE_BLOCK, np.float64)

    # -- the step count and the rate of each step ---------------------------------------------
    def _rate_of(self, learning_rate, t):
        """Step t's rate: Adam's bias-corrected step size, SGD's learning rate."""
        if self.kind == "sgd":
            return float(learning_rate)
        return float(adam_lr(learning_rate, self.beta1, self.beta2, t))

    def next_step(self):
        """Advance the step count by one at the current ``learning_rate`` and record the
        step's rate (O(1): one table entry and its prefix sum; the table doubles when full)."""
        t = self._t + 1
        if t >= self._rates.shape[0]:
            rates = np.zeros(2 * self._rates.shape[0], np.float64)
            sums = np.zeros_like(rates)
            rates[:t] = self._rates[:t]
            sums[:t] = self._rate_sums[:t]
            self._rates, self._rate_sums = rates, sums
        self._rates[t] = self._rate_of(self.learning_rate, t)
        extend_rate_sums(self._rates, self._rate_sums, self._powers, t, t + 1)
        self._t = t

    @property
    def t(self):
        """Steps taken so far."""
        return self._t

    @t.setter
    def t(self, value):
        """Set the step count; steps beyond those recorded count as taken at the current
        ``learning_rate`` (``set_step_rates`` gives each step's rate)."""
        value = int(value)
        if value < 0:
            raise ValueError(f"optimizer step count must be non-negative, got {value}")
        known = min(value, self._t)
        rates = np.concatenate([self._rates[:known + 1],
                                self.constant_rates(value)[known + 1:]])
        self.set_step_rates(rates)

    @property
    def step_rates(self):
        """The rate of every step so far, ``[0, c_1, ..., c_t]`` (float64, a read-only view)."""
        view = self._rates[:self._t + 1]
        view.flags.writeable = False
        return view

    def set_step_rates(self, rates):
        """Continue after ``len(rates) - 1`` steps taken at these rates (the ``step_rates`` of
        a saved optimizer); ValueError unless they are a non-empty 1-D float64 array of finite
        non-negative numbers."""
        rates = np.asarray(rates)
        if rates.ndim != 1 or rates.shape[0] < 1 or rates.dtype != np.float64:
            raise ValueError(f"optimizer step rates must be a non-empty 1-D float64 array, got "
                             f"shape {rates.shape} and dtype {rates.dtype}")
        if not (np.isfinite(rates).all() and (rates >= 0).all()):
            raise ValueError("optimizer step rates must be finite and non-negative")
        t = rates.shape[0] - 1
        cap = RATE_BLOCK
        while cap <= t:
            cap *= 2
        self._rates = np.zeros(cap, np.float64)
        self._rates[1:t + 1] = rates[1:]
        self._rate_sums = np.zeros(cap, np.float64)
        extend_rate_sums(self._rates, self._rate_sums, self._powers, 0, t + 1)
        self._t = t

    def constant_rates(self, t):
        """The rates of ``t`` steps all taken at the current ``learning_rate`` (for a state
        saved before the rates were recorded)."""
        k = np.arange(t + 1, dtype=np.float64)
        if self.kind == "sgd":
            rates = np.full(t + 1, self.learning_rate, np.float64)
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                rates = adam_lr(self.learning_rate, self.beta1, self.beta2, k)
        rates[0] = 0.0
        return rates

    @property
    def _adam(self):
        return self.kind != "sgd"

    @property
    def moments(self):
        return Moments(self.MW, self.VW, self.MB, self.VB, self.TW, self.TB)

    def _hyper(self):
        """The kernels' bundle at the current step: its recorded rate, betas, eps, the rate
        record."""
        t = self._t
        lr_t = self._rates[t] if t > 0 else self._rate_of(self.learning_rate, 1)
        return Hyper(float(lr_t), self.beta1, self.beta2, self.epsilon, int(t), self._rates,
                     self._rate_sums)

    def step(self, params, touched, n_rows, n_bias):
        """One step on the rows and biases a batch touched: ``params`` (W, B, GW, GB) and
        ``touched`` (starts, lens, rowids, bias_ids) are ``slide.kernels.arrays`` bundles;
        the first ``n_rows`` / ``n_bias`` entries are used."""
        self.next_step()
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
        mom, h, kind = self._output_args()
        output_step(W, B, mom, h, kind, int(lay.w_off[last]), int(lay.b_off[last]), out_rows,
                    n_uniq, store)

    def _output_args(self):
        """(moments with the output layer's step records, hyper, kind) of the output layer's
        row updates."""
        lay = self.layout
        last = lay.n_layers - 1
        mom = self.moments
        if mom.TW.shape[0]:
            mom = mom._replace(TW=self.TW[int(lay.row_off[last]):int(lay.row_off[last + 1])],
                               TB=self.TB[int(lay.b_off[last]):int(lay.b_off[last + 1])])
        return mom, self._hyper(), KIND_ADAM if self._adam else KIND_SGD

    def step_block(self, W, B, rows, dW, db, stamp, serial):
        """The batched engine's shared block of the output layer (``block_step``; after
        ``step`` of the same batch, like ``step_output``)."""
        mom, h, kind = self._output_args()
        lay = self.layout
        last = lay.n_layers - 1
        block_step(W, B, mom, h, kind, int(lay.w_off[last]), int(lay.b_off[last]), rows, dW,
                   db, stamp, np.int64(serial))

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
        """{"meta": JSON-able settings and step count, "arrays": the moments, step records and
        step rates (copies)}. ``SparseOptimizer.from_state(layout, state)`` rebuilds an optimizer that
        continues exactly."""
        meta = {"kind": self.kind, "learning_rate": self.learning_rate, "beta1": self.beta1,
                "beta2": self.beta2, "epsilon": self.epsilon, "t": int(self.t)}
        arrays = {k: v.copy() for k, v in self.state_arrays().items()}
        arrays["opt_rates"] = self.step_rates.copy()
        return {"meta": meta, "arrays": arrays}

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
        if "opt_rates" in arrays:
            rates = np.asarray(arrays["opt_rates"])
            if rates.shape != (int(t) + 1,):
                raise ValueError(f"optimizer state: 'opt_rates' has shape {rates.shape}, "
                                 f"expected ({int(t) + 1},) (one rate per step)")
            opt.set_step_rates(rates)
        else:
            # saved before the rates were recorded: the past steps as at the saved rate
            opt.set_step_rates(opt.constant_rates(int(t)))
        for name, target in opt.state_arrays().items():
            if name not in arrays:
                raise ValueError(f"optimizer state lacks array {name!r}")
            a = np.asarray(arrays[name])
            if a.shape != target.shape or a.dtype != target.dtype:
                raise ValueError(f"optimizer state: {name!r} has shape {a.shape} and dtype "
                                 f"{a.dtype}, expected {target.shape} {target.dtype}")
            target[...] = a
        return opt
