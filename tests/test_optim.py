"""Sparse Adam with catch-up (dense Adam's trajectory, under any learning-rate schedule),
frequency-proportional negatives and the log-prior output bias."""
import numpy as np
import pytest

from slide import SlideClassifier
from slide.network import Network
from slide.kernels.arrays import Params, make_touched
from slide.kernels.layers import Layout
from slide.network.optim import SparseOptimizer

B1, B2, EPS = 0.9, 0.999, 1e-8


def _dense_adam(w, grads, lrs, t0=0):
    """Reference: dense Adam (Kingma & Ba, Algorithm 1 with the step size folded into
    alpha_t = alpha sqrt(1 - beta2^t) / (1 - beta1^t) and epsilon added to sqrt(v), as the
    paper's section 2 and TensorFlow write it), in float64, every parameter at every step.
    ``grads[i]``: {row: gradient} of step t0 + i + 1 (rows not listed: zero gradient);
    ``lrs[i]``: that step's learning rate alpha. Returns w after each step."""
    w = w.astype(np.float64).copy()
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    out = []
    for i, (rows, lr) in enumerate(zip(grads, lrs)):
        t = t0 + i + 1
        g = np.zeros_like(w)
        for r, gr in rows.items():
            g[r] = gr
        m = B1 * m + (1 - B1) * g
        v = B2 * v + (1 - B2) * g * g
        alpha_t = lr * np.sqrt(1.0 - B2 ** t) / (1.0 - B1 ** t)
        w = w - alpha_t * m / (np.sqrt(v) + EPS)
        out.append(w.copy())
    return out


def _sparse_adam(w0, grads, lrs, t0=0, kind="adam", flush_at=(), keep=None):
    """slide's SparseOptimizer on the rows of w0 [n_rows, width] (the rows of a first layer,
    one input feature each), each step updating only the rows ``grads[i]`` lists, at learning
    rate ``lrs[i]``, starting after ``t0`` steps. Flushes after the steps ``flush_at`` (1-based
    counts of this run's steps) and returns the weights there: {step: W [n_rows, width]}.
    ``keep``: a list the optimizer is appended to."""
    n_rows, width = w0.shape
    lay = Layout((n_rows, width))
    opt = SparseOptimizer(kind, lay, lrs[0], B1, B2, EPS)
    opt.t = t0
    W = np.zeros(lay.n_weights, np.float32)
    W[:] = w0.ravel()
    B = np.zeros(lay.n_biases, np.float32)
    params = Params(W, B, np.zeros_like(W), np.zeros_like(B))
    touched = make_touched(lay)
    if keep is not None:
        keep.append(opt)
    out = {}
    for i, (rows, lr) in enumerate(zip(grads, lrs)):
        for n, (r, g) in enumerate(sorted(rows.items())):
            params.GW[r * width:(r + 1) * width] = g
            touched.starts[n], touched.lens[n], touched.rowids[n] = r * width, width, r
        opt.learning_rate = lr
        opt.step(params, touched, len(rows), 0)
        assert not params.GW.any()             # the gradient buffer is zeroed
        if i + 1 in flush_at:
            opt.flush(W, B)
            again = W.copy()
            opt.flush(W, B)
            assert np.array_equal(W, again)    # flushing twice changes nothing
            out[i + 1] = W.reshape(n_rows, width).copy()
    return out


def _cosine(base, n_steps):
    """A half-cosine decay from ``base`` over ``n_steps`` steps (written here, independent of
    slide.network.trainer)."""
    return [base * 0.5 * (1.0 + np.cos(np.pi * i / n_steps)) for i in range(n_steps)]


@pytest.mark.parametrize("touch_steps", [(1, 5), (1, 2, 30), (3,)])
def test_catch_up_follows_dense_adam(touch_steps):
    rng = np.random.default_rng(0)
    n, n_steps, lr = 6, 40, 1e-2
    t0 = 100_000
    w0 = rng.standard_normal((1, n)).astype(np.float32)
    grads = [{0: rng.standard_normal(n)} if (i + 1) in touch_steps else {}
             for i in range(n_steps)]
    ref = _dense_adam(w0, grads, [lr] * n_steps, t0)[-1]
    adam = _sparse_adam(w0, grads, [lr] * n_steps, t0, flush_at=(n_steps,))[n_steps]
    lazy = _sparse_adam(w0, grads, [lr] * n_steps, t0, kind="lazy_adam",
                        flush_at=(n_steps,))[n_steps]
    np.testing.assert_allclose(adam, ref, rtol=1e-4, atol=1e-5)
    # lazy Adam (no catch-up) is measurably different: the test can fail
    assert np.abs(lazy - ref).max() > 1e-3


def test_catch_up_is_dense_adam_under_a_cosine_schedule():
    """Rows idle for long gaps of a cosine-decayed run (625 steps, the default's length) move
    as dense Adam moves them, each missed step at its own scheduled, bias-corrected rate.
    Gradients of order 1 keep sqrt(v) >= ~1e-2 over the gaps, so epsilon (the one term the
    catch-up approximates) is ~1e-6 of it. Tolerance: 1e-6 absolute on weights of order 1
    that move by 0.06-0.23, float32 rounding over 625 steps (measured: <= 2e-7; a catch-up at
    the rate of the step that catches up, the engine before issue 28, was off by 0.047)."""
    rng = np.random.default_rng(5)
    n_steps, width = 625, 3
    touches = {0: (1, 2, 300, 400), 1: (5, 500), 2: (1,), 3: (250, 251, 252, 600),
               4: tuple(range(1, 626, 97))}
    w0 = rng.standard_normal((len(touches), width)).astype(np.float32)
    grads = [{r: rng.standard_normal(width) for r, steps in touches.items() if k in steps}
             for k in range(1, n_steps + 1)]
    lrs = _cosine(1e-2, n_steps)
    ref = _dense_adam(w0, grads, lrs)
    checks = (100, 299, 301, 450, 599, 625)
    got = _sparse_adam(w0, grads, lrs, flush_at=checks)
    for k in checks:
        np.testing.assert_allclose(got[k], ref[k - 1], rtol=0, atol=1e-6, err_msg=f"step {k}")
    moved = np.abs(ref[-1] - w0).max(axis=1)
    assert (moved > 0.05).all()             # every row moved far more than the tolerance


def test_first_moments_that_decay_away_never_become_subnormal():
    """A first moment whose gradient stays zero decays by beta1 a step; below
    ``MOMENT_FLOOR`` it is stored as 0, never as a subnormal float32 (each multiply that reads
    or produces one costs a microcode assist on x86: 1.6-1.9x slower batches at Amazon-670K
    before). Row 0 is touched every step, its first column's gradient zero after step 1 (a
    dead hidden unit's column); row 1 is touched at steps 1 and 795 (a catch-up over 793
    missed steps, then a zero gradient in that column). Without the floor both moments are
    ~1e-42 at step 800: subnormal. The weights still follow dense Adam."""
    from slide.network.adam import MOMENT_FLOOR
    n_steps = 800
    w0 = np.array([[0.5, -0.25], [0.125, 1.0]], np.float32)
    grads = [{0: np.array([1e-4 if k == 1 else 0.0, 1.0])} for k in range(1, n_steps + 1)]
    grads[0][1] = np.array([1e-4, 1e-4])
    grads[794][1] = np.array([0.0, 1.0])
    keep = []
    got = _sparse_adam(w0, grads, [1e-3] * n_steps, flush_at=(n_steps,), keep=keep)[n_steps]
    opt = keep[0]
    tiny = np.finfo(np.float32).tiny
    for moments in (opt.MW, opt.VW):
        a = np.abs(moments)
        assert not ((a > 0) & (a < tiny)).any()
    mw = opt.MW.reshape(2, 2)
    assert mw[0, 0] == 0.0 and mw[1, 0] == 0.0
    assert (np.abs(mw[:, 1]) >= MOMENT_FLOOR).all()     # live moments are kept
    ref = _dense_adam(w0, grads, [1e-3] * n_steps)[-1]
    # the flushed moments would have moved their weights by < 1e-30; the tolerance is float32
    # rounding of 800 steps of ~1e-3 (measured 7e-6 in the second column, whose gradient 1.0
    # moves it by 0.8)
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-5)


def test_a_rows_catch_up_costs_a_few_blocks_whatever_its_gap():
    """The discounted sum over a gap of a million steps reads a few blocks of prefix sums
    and equals the direct sum (whose terms past ~350 steps are below 1e-16 of the first)."""
    from slide.network.adam import RATE_BLOCK, block_powers, discounted_rate_sum, extend_rate_sums
    rng = np.random.default_rng(1)
    n = 1_000_000
    rates = np.zeros(n + 1)
    rates[1:] = rng.random(n) * 1e-2
    sums = np.zeros_like(rates)
    extend_rate_sums(rates, sums, block_powers(B1, B2), 0, n + 1)
    r = B1 / np.sqrt(B2)
    for s, e in ((3, 10), (60, 70), (64, 128), (1000, n), (n - 200, n), (7, 7 + RATE_BLOCK)):
        j = np.arange(s + 1, min(e, s + 2000) + 1)
        direct = float(np.sum(rates[j] * r ** (j - s)))
        assert discounted_rate_sum(sums, s, e, r) == pytest.approx(direct, rel=1e-12)


def test_the_catch_ups_power_tables_give_the_computed_powers_bits():
    """``power_tables``: the catch-up's closed form reads its powers from a table instead of
    computing them; over random idle gaps (inside and beyond the table) and three pairs of
    betas, every factor is the same float64 as computed."""
    from numba import njit
    from slide.network.adam import (Hyper, _missed_steps, adam_lr, block_powers,
                                    extend_rate_sums, power_tables)
    rng = np.random.default_rng(2)
    n = 50_000
    rates = adam_lr(1e-3, B1, B2, np.arange(n) + 1.0) * rng.uniform(0.5, 1.5, n)

    @njit
    def differing(lasts, ts, with_tables, without):
        bad = 0
        for i in range(lasts.shape[0]):
            if _missed_steps(lasts[i], ts[i], with_tables) != \
                    _missed_steps(lasts[i], ts[i], without):
                bad += 1
        return bad

    for b1, b2 in ((B1, B2), (0.95, 0.9999), (0.5, 0.9)):
        sums = np.zeros(n)
        extend_rate_sums(rates, sums, block_powers(b1, b2), 0, n)
        ts = rng.integers(2, n, 20_000)
        lasts = np.maximum(ts - rng.integers(1, 3000, ts.shape[0]), 0)
        on = Hyper(1e-3, b1, b2, EPS, 0, rates, sums, power_tables(b1, b2))
        off = on._replace(power_tables=np.zeros((0, 0), np.float64))
        assert differing(lasts, ts, on, off) == 0


def test_frequency_negatives_weights():
    C, n = 1000, 64
    net = Network((10, 4, C), [False, True], [0, 0], seed=0, shared_negatives=n,
                  negative_power=1.0)
    counts = np.zeros(C)
    counts[7] = 1e7                      # one label holds nearly all the mass
    net.set_label_counts(counts)
    ids = net.negatives.draw(1, 1)
    assert 7 in ids and len(ids) < n     # drawn every time; the rest are near-uniform repeats
    assert abs(net.negatives.corr[7]) < 1e-6  # P(drawn) ~ 1: no up-weighting
    # uniform counts: the weight is -log P(drawn) ~ log(C / n), the uniform logQ correction
    net.set_label_counts(np.zeros(C))
    ids = net.negatives.draw(1, 2)
    p_in = 1.0 - (1.0 - 1.0 / C) ** n
    np.testing.assert_allclose(net.negatives.corr[ids], -np.log(p_in), rtol=1e-5)
    # deterministic in (seed, serial)
    assert np.array_equal(ids, net.negatives.draw(1, 2))


SMALL = dict(K=2, L=8, range_pow=6, bucket_size=16, sampler_budget=32, shared_negatives=32,
             learning_rate=1e-2, batch_size=32, n_threads=1, random_state=0,
             lr_schedule="constant")


def test_log_prior_bias_init(tiny):
    X, Y = tiny[0], tiny[1]
    counts = np.bincount(Y.indices, minlength=Y.shape[1])
    first = {}

    def grab(model, info):
        lay = model.network_.layout
        first["b"] = lay.bias_view(model.network_.B, lay.n_layers - 1).copy()
        return True

    SlideClassifier(**SMALL).fit(X, Y, callback=grab)
    b = first["b"]
    # computed here from the definition: log((count + 1) / (n_samples + n_labels))
    n, n_labels = X.shape[0], Y.shape[1]
    expect = np.array([np.log((float(c) + 1.0) / (n + n_labels)) for c in counts])
    # one Adam step of size ~lr moves a bias by at most ~lr * (1 + momentum catch-up)
    assert np.abs(b - expect).max() < 0.1
    assert b[np.argmax(counts)] > b[counts == 0].max() + 2
    # the init itself, to float32 rounding: a step of 1e-7 moves no bias by more than ~1e-7,
    # while an off-by-one in the count (log((c + 2) / (c + 1)) >= 0.0025 here) or in the
    # denominator (log((n + L + 1) / (n + L)) = 1.25e-3 with 600 rows and 200 labels) is
    # 10-100 times the tolerance
    assert 1.0 / (n + n_labels) > 1e-3 and counts.max() < 400
    SlideClassifier(**dict(SMALL, learning_rate=1e-7)).fit(X, Y, callback=grab)
    np.testing.assert_allclose(first["b"], expect, rtol=0, atol=1e-4)
    SlideClassifier(**SMALL, output_bias_init="zero").fit(X, Y, callback=grab)
    assert np.abs(first["b"]).max() < 0.1


def test_sync_before_inference_is_deterministic(tiny):
    X, Y, Xt, Yt = tiny

    def stop(model, info):
        return info["batch"] == 9

    a = SlideClassifier(**SMALL, epochs=2).fit(X, Y, callback=stop)
    assert a.optimizer_.pending          # rows touched at earlier batches have steps to take
    W_before = a.network_.W.copy()
    pa = a.predict_topk(Xt, k=3)         # syncs first
    assert not a.optimizer_.pending
    assert not np.array_equal(W_before, a.network_.W)
    W_synced = a.network_.W.copy()
    assert np.array_equal(pa, a.predict_topk(Xt, k=3))
    assert np.array_equal(W_synced, a.network_.W)      # a second sync is a no-op
    # the same calls in the same order give bit-identical models
    b = SlideClassifier(**SMALL, epochs=2).fit(X, Y, callback=stop)
    b.predict_topk(Xt, k=3)
    a.fit(X, Y, resume=True)
    b.fit(X, Y, resume=True)
    assert np.array_equal(a.network_.W, b.network_.W)
    assert not a.optimizer_.pending      # an epoch ends with a sync


def test_optimizer_parameters_are_validated(tiny):
    X, Y = tiny[0], tiny[1]
    with pytest.raises(ValueError, match="negative_power"):
        SlideClassifier(negative_power=-1).fit(X, Y)
    with pytest.raises(ValueError, match="output_bias_init"):
        SlideClassifier(output_bias_init="prior").fit(X, Y)
    with pytest.raises(ValueError, match="optimizer"):
        SlideClassifier(optimizer="adamw").fit(X, Y)


def _bias_steps(n_threads, monkeypatch):
    """Biases of a two-layer layout stepped 40 times by ``SparseOptimizer.step`` with numba
    reporting ``n_threads`` threads (above 2 the step takes the serial bias kernel), each
    step touching a random subset (so the catch-up runs over varied gaps): (B, MB, VB, TB)."""
    from slide.network import optim
    monkeypatch.setattr(optim.numba, "get_num_threads", lambda: n_threads)
    rng = np.random.default_rng(3)
    lay = Layout((5, 64, 7))
    opt = SparseOptimizer("adam", lay, 1e-2, B1, B2, EPS)
    W = np.zeros(lay.n_weights, np.float32)
    B = rng.standard_normal(lay.n_biases).astype(np.float32)
    params = Params(W, B, np.zeros_like(W), np.zeros_like(B))
    touched = make_touched(lay)
    for _ in range(40):
        ids = np.flatnonzero(rng.random(lay.n_biases) < 0.4)
        params.GB[ids] = rng.standard_normal(ids.shape[0]).astype(np.float32)
        touched.bias_ids[:ids.shape[0]] = ids
        opt.step(params, touched, 0, ids.shape[0])
        assert not params.GB.any()              # the gradient buffer is zeroed
    return B, opt.MB, opt.VB, opt.TB


def test_serial_bias_step_gives_the_parallel_bits(monkeypatch):
    """Beyond 2 threads a step's few biases are updated on the calling thread
    (``adam_ids_serial``); the bits are those of the parallel loop (``adam_ids``)."""
    serial = _bias_steps(16, monkeypatch)
    parallel = _bias_steps(2, monkeypatch)
    assert serial[3].max() == 40                # every bias stepped, up to the last step
    for a, b in zip(serial, parallel):
        np.testing.assert_array_equal(a, b)
