"""The sparse optimizers' arithmetic: Adam and SGD over the rows touched by a batch only.

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

The row kernels of the output layer and of the batched engine's first layer, which form their
gradient as they update, are in ``slide.network.row_steps``; ``slide.network.optim`` holds the
optimizer's state (``SparseOptimizer``).
"""
from typing import NamedTuple

import numpy as np
from numba import prange

from slide.kernels.atomic import claim_step
from slide.kernels.jit import njit
from slide.kernels.layers import FASTMATH


OPTIMIZERS = {"adam": 0, "sgd": 1, "lazy_adam": 2}
KIND_ADAM, KIND_SGD = 0, 1          # the row steps' update rule


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
    (``extend_rate_sums``), from which the catch-up takes the missed steps' rates, and the
    powers its closed form reads (``power_tables``; empty: computed)."""
    lr_t: float
    beta1: float
    beta2: float
    eps: float
    t: int
    rates: np.ndarray
    rate_sums: np.ndarray
    power_tables: np.ndarray


def adam_lr(learning_rate, beta1, beta2, t):
    """Bias-corrected step size of Adam at step ``t`` (1-based)."""
    return learning_rate * np.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t)


# the discounted prefix sums of the step rates restart every RATE_BLOCK steps, so a sum over
# a block is one subtraction and its weight r^(block start - s) stays in float64's range
RATE_BLOCK = 64
# the catch-up drops the blocks after the first step whose weight r^(k-s) is below this
# (module docstring: the bound of what they would add)
TAIL_WEIGHT = 1e-16


# the catch-up's powers (``power_tables``): r^e for -RATE_BLOCK <= e < POWER_TABLE - RATE_BLOCK,
# beta1^n and beta2^n for 0 <= n < POWER_TABLE; beyond them it computes the power itself
POWER_TABLE = 1024


@njit(cache=True, nogil=True)
def power_tables(beta1, beta2):
    """[3, POWER_TABLE] float64: r^(e - RATE_BLOCK) (r = beta1 / sqrt(beta2)), beta1^n and
    beta2^n, each computed as ``_missed_steps`` computes the power (Numba's integer power), so
    a lookup gives the same bits. A catch-up's closed form computed these as it went, a chain
    of dependent multiplies (a square-and-multiply loop each) that every idle row waited on."""
    out = np.empty((3, POWER_TABLE), np.float64)
    r = beta1 / np.sqrt(beta2)
    for i in range(POWER_TABLE):
        e = i - RATE_BLOCK
        out[0, i] = r ** e
        out[1, i] = beta1 ** i
        out[2, i] = beta2 ** i
    return out


@njit(cache=True, nogil=True)
def _power(tables, row, base, e, shift):
    """base ** e from row ``row`` of ``power_tables`` (entry e + shift), or computed."""
    i = e + shift
    if tables.shape[0] > 0 and 0 <= i < tables.shape[1]:
        return tables[row, i]
    return base ** e


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
def discounted_rate_sum(sums, s, e, r, tables=np.zeros((0, 0), np.float64)):
    """sum_{k=s+1..e} c_k r^(k-s) (e > s) from the block prefix sums ``sums`` of the rates c:
    one subtraction per block of RATE_BLOCK steps, stopping after the first block whose next
    step's weight r^(k-s) is below TAIL_WEIGHT, so a row idle for any number of steps costs a
    few blocks; the powers of r from ``tables`` (``power_tables``) where given. Not fastmath:
    the difference of two prefix sums is the delicate part (its relative error is ~1e-16 *
    r^-RATE_BLOCK / (1 - r), ~1e-12, far below float32's)."""
    total = 0.0
    k = s + 1
    while k <= e:
        b = (k // RATE_BLOCK) * RATE_BLOCK
        hi = min(e, b + RATE_BLOCK - 1)
        part = sums[hi] if k == b else sums[hi] - sums[k - 1]
        # literal row and shift on purpose (a signature each): they fold into the catch-up's
        # loop (docs/design.md, "One compile a kernel")
        total += part * _power(tables, 0, r, b - s, RATE_BLOCK)
        k = hi + 1
        if _power(tables, 0, r, k - s, RATE_BLOCK) < TAIL_WEIGHT:
            break
    return total


# A first moment below this is stored as 0. Adam's first moment of a weight whose gradient
# stays zero (a column of a hidden unit that died, a row idle for hundreds of steps) decays by
# beta1 each step, down into float32's subnormal range (below 1.2e-38), where every multiply
# that reads or produces one takes a microcode assist of ~100 cycles on x86. At the
# Amazon-670K shape ~1M moments were subnormal after 700 batches and batches 550-860 of an
# epoch ran 1.6-1.9x slower (bench/results/subnormal_moments_*.log). The floor sits far enough
# above that range that neither beta1 * m (beta1 >= 1e-7) nor the catch-up's m * beta1^n
# (``SMALL_DECAY``) produces a subnormal, so not even the crossing pays the assist. What is
# flushed moves a weight by less than lr * 1e-30 / eps: nothing in float32. (TensorFlow's
# worker threads flush subnormals to zero for the same reason.)
MOMENT_FLOOR = np.float32(2.0 ** -100)
# beta1^n below this (n > 153 steps at beta1 = 0.9): the catch-up drops the first moment
# (``_catch_up``); above it, m * beta1^n >= MOMENT_FLOOR * SMALL_DECAY = 7.9e-38 is a normal
# float32
SMALL_DECAY = 1e-7


@njit(cache=True, nogil=True)
def _flush(m):
    """``m``, or 0 where its magnitude is below ``MOMENT_FLOOR``."""
    return m if abs(m) >= MOMENT_FLOOR else np.float32(0.0)


@njit(cache=True, nogil=True)
def _consts(hyper):
    """The float32 constants of the Adam update: (b1, b2, 1 - b1, 1 - b2, lr_t, eps)."""
    return (np.float32(hyper.beta1), np.float32(hyper.beta2), np.float32(1.0 - hyper.beta1),
            np.float32(1.0 - hyper.beta2), np.float32(hyper.lr_t), np.float32(hyper.eps))


@njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def _adam_row(w, mm, vv, gg, k, fused_output):
    """THE Adam update (every path uses it; ``_adam_row_scaled`` is its spelling for a
    gradient formed as it is read), in place on a row: w, its moments mm, vv, its gradient gg;
    ``k`` = ``_consts(hyper)``. A single parameter is a row of length 1.

    ``fused_output`` (a constant at each call site) only selects between two spellings of the
    same formula that the engine has always used: the output layer's fused step reads g[i]
    twice, the buffered layers read it once. Under fastmath the two compile to differently
    contracted multiply-adds and differ in the last bit, and tests/test_golden.py pins the
    trajectories bit for bit; using one spelling everywhere is a deliberate, separately
    reviewed change (regenerate the fixture with tests/make_golden.py)."""
    b1, b2, c1, c2, lr, ep = k
    for i in range(w.shape[0]):
        if fused_output:
            m = _flush(b1 * mm[i] + c1 * gg[i])
            v = b2 * vv[i] + c2 * gg[i] * gg[i]
        else:
            g = gg[i]
            m = _flush(b1 * mm[i] + c1 * g)
            v = b2 * vv[i] + c2 * g * g
        mm[i] = m
        vv[i] = v
        w[i] -= lr * m / (np.sqrt(v) + ep)


@njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def _adam_row_scaled(w, mm, vv, xv, d, k):
    """``_adam_row`` of a row whose gradient is ``xv * d`` (a scalar times a vector: a feature
    row with one entry in the batch, most of them), formed as it is read: no gradient buffer
    to zero, fill and read back (the batched engine's first layer at the Amazon-670K shape:
    85 % of a batch's rows).
    The same operations in the same order as ``_adam_row`` on a buffer holding xv * d: the
    golden fixture's bits did not move."""
    b1, b2, c1, c2, lr, ep = k
    for i in range(w.shape[0]):
        g = xv * d[i]
        m = _flush(b1 * mm[i] + c1 * g)
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
    p = hyper.power_tables
    return (discounted_rate_sum(hyper.rate_sums, last, t - 1, r, p),
            _power(p, 1, hyper.beta1, n, 0), _power(p, 2, hyper.beta2, n, 0), n)


@njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def _catch_up(w, mm, vv, last, t, hyper):
    """Apply to one row the zero-gradient steps it missed between steps ``last`` and ``t``,
    each at its own recorded rate (``hyper.rate_sums``)."""
    _apply_missed(w, mm, vv, _missed_steps(last, t, hyper), hyper)


@njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def _apply_missed(w, mm, vv, missed, hyper):
    """``_catch_up`` with the missed steps' closed form ``missed`` (``_missed_steps``) given:
    a neuron's row and bias, whose step records agree, share one."""
    srt, d1, d2, n = missed
    if n == 0:
        return
    lrs = np.float32(srt)
    # beta1^n below SMALL_DECAY (an idle gap of over 153 steps at beta1 = 0.9): the first
    # moment is dropped, not decayed. m * beta1^n could otherwise fall below float32's normal
    # range, and producing a subnormal costs the assist the floor avoids; above it,
    # m * beta1^n >= MOMENT_FLOOR * SMALL_DECAY is a normal float32. What is dropped is under
    # 1e-7 of the momentum the row last had: it would move the weight by under 1e-7 of that
    # step's size (the missed steps themselves are applied in full, through lrs)
    f1 = np.float32(d1) if d1 >= SMALL_DECAY else np.float32(0.0)
    f2 = np.float32(d2)
    ep = np.float32(hyper.eps)
    for i in range(w.shape[0]):
        m = mm[i]
        v = vv[i]
        w[i] -= lrs * m / (np.sqrt(v) + ep)
        mm[i] = _flush(m * f1)
        vv[i] = v * f2


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True)
def adam_rows(W, M, V, G, T, starts, lens, rowids, n, hyper):
    """Adam on the rows ``W[starts[i]:starts[i]+lens[i]]`` for i < n; zeroes their gradient.
    With a step record ``T`` (non-empty), first the zero-gradient steps each row missed since
    ``T[rowids[i]]``, whose record becomes t in the same atomic claim (``claim_step``: a batch
    in flight beside this one catches up none of the steps this one does)."""
    k = _consts(hyper)
    for r in prange(n):
        s = starts[r]
        e = s + lens[r]
        if T.shape[0] > 0:
            _catch_up(W[s:e], M[s:e], V[s:e], claim_step(T, rowids[r], hyper.t), hyper.t,
                      hyper)
        _adam_row(W[s:e], M[s:e], V[s:e], G[s:e], k, False)
        G[s:e] = 0.0


@njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def _adam_id(B, M, V, G, T, e, k, hyper):
    """Adam on the single entry ``B[e]`` (missed steps first with a step record ``T``);
    zeroes its gradient: ``adam_ids``' and ``adam_ids_serial``'s one body."""
    if T.shape[0] > 0:
        _catch_up(B[e:e + 1], M[e:e + 1], V[e:e + 1], claim_step(T, e, hyper.t), hyper.t, hyper)
    _adam_row(B[e:e + 1], M[e:e + 1], V[e:e + 1], G[e:e + 1], k, False)
    G[e] = 0.0


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True)
def adam_ids(B, M, V, G, T, ids, n, hyper):
    """Adam on the single entries ``B[ids[i]]`` for i < n (biases); zeroes their gradient.
    With a step record ``T`` (non-empty), missed steps first, as in ``adam_rows``."""
    k = _consts(hyper)
    for r in prange(n):
        _adam_id(B, M, V, G, T, ids[r], k, hyper)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def adam_ids_serial(B, M, V, G, T, ids, n, hyper):
    """``adam_ids`` on the calling thread: for a few entries (the batched engine's first-layer
    biases, every batch) the fork and join of a parallel loop on many threads cost more than
    the work (``SparseOptimizer.step`` picks by ``optim.SERIAL_IDS``, and keeps the loop at 2
    threads, where it is faster)."""
    k = _consts(hyper)
    for r in range(n):
        _adam_id(B, M, V, G, T, ids[r], k, hyper)


class TouchedStep(NamedTuple):
    """What ``touched_step`` needs of the optimizer at one step."""
    moments: Moments         # the moments and step records of every layer
    hyper: Hyper             # the step's rate, betas, eps, number and rate record
    kind: int                # KIND_ADAM or KIND_SGD
    serial_most: int         # the most biases stepped on the calling thread (-1: none)
    lr: float                # SGD's learning rate


@njit(cache=True, nogil=True)
def touched_step(params, tb, n_rows, n_bias, opt):
    """One step on the rows and biases a batch touched (``tb``: the ``Touched`` bundle, its
    first ``n_rows`` / ``n_bias`` entries), after the step count advanced, as ``opt``
    (``TouchedStep``) describes it. A parallel loop costs its threads' fork and join even
    over nothing: none runs without rows (the batched engine's first layer has its own
    step)."""
    W, B, GW, GB = params.W, params.B, params.GW, params.GB
    mom, hyper, kind, serial_most, lr = opt.moments, opt.hyper, opt.kind, \
        opt.serial_most, opt.lr
    if kind == KIND_ADAM:
        if n_rows > 0:
            adam_rows(W, mom.MW, mom.VW, GW, mom.TW, tb.starts, tb.lens, tb.rowids, n_rows,
                      hyper)
        if n_bias > 0:
            if n_bias <= serial_most:
                adam_ids_serial(B, mom.MB, mom.VB, GB, mom.TB, tb.bias_ids, n_bias, hyper)
            else:
                adam_ids(B, mom.MB, mom.VB, GB, mom.TB, tb.bias_ids, n_bias, hyper)
    else:
        if n_rows > 0:
            sgd_rows(W, GW, tb.starts, tb.lens, n_rows, lr)
        if n_bias > 0:
            sgd_ids(B, GB, tb.bias_ids, n_bias, lr)


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
