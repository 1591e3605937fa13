"""Sparse Adam with catch-up (dense Adam's trajectory), frequency-proportional negatives and the
log-prior output bias."""
import numpy as np
import pytest

from slide import SlideClassifier
from slide.engine import Network
from slide.optim import Hyper, adam_flush_rows, adam_lr, adam_rows

B1, B2, EPS = 0.9, 0.999, 1e-8


def _dense_adam(w, grads, lr, t0):
    """Reference: plain dense Adam over every step, zero gradient where ``grads`` has None."""
    w = w.astype(np.float64).copy()
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for i, g in enumerate(grads):
        t = t0 + i + 1
        g = np.zeros_like(w) if g is None else g
        m = B1 * m + (1 - B1) * g
        v = B2 * v + (1 - B2) * g * g
        w -= adam_lr(lr, B1, B2, t) * m / (np.sqrt(v) + EPS)
    return w


@pytest.mark.parametrize("touch_steps", [(1, 5), (1, 2, 30), (3,)])
def test_catch_up_follows_dense_adam(touch_steps):
    rng = np.random.default_rng(0)
    n, n_steps, lr = 6, 40, 1e-2
    # far into training the bias correction is ~1, so the catch-up's use of the current step
    # size is exact up to rounding (the approximation is documented in slide.optim)
    t0 = 100_000
    w0 = rng.standard_normal(n).astype(np.float32)
    grads = [rng.standard_normal(n) if (i + 1) in touch_steps else None for i in range(n_steps)]
    ref = _dense_adam(w0, grads, lr, t0)

    results = {}
    for catch_up in (True, False):
        W = w0.copy()
        M = np.zeros(n, np.float32)
        V = np.zeros(n, np.float32)
        G = np.zeros(n, np.float32)
        T = np.zeros(1 if catch_up else 0, np.int32)
        one = np.zeros(1, np.int64)
        lens = np.array([n], np.int64)
        for i, g in enumerate(grads):
            if g is None:
                continue
            t = t0 + i + 1
            G[:] = g
            adam_rows(W, M, V, G, T, one, lens, one, 1,
                      Hyper(adam_lr(lr, B1, B2, t), B1, B2, EPS, t - t0))
            assert not G.any()             # the gradient buffer is zeroed
        if catch_up:
            t_end = t0 + n_steps
            adam_flush_rows(W, M, V, T, 0, 1, n, Hyper(adam_lr(lr, B1, B2, t_end), B1, B2, EPS,
                                                       n_steps))
            assert T[0] == n_steps
            again = W.copy()
            adam_flush_rows(W, M, V, T, 0, 1, n, Hyper(adam_lr(lr, B1, B2, t_end), B1, B2, EPS,
                                                       n_steps))
            assert np.array_equal(W, again)    # flushing twice changes nothing
        results[catch_up] = W
    np.testing.assert_allclose(results[True], ref, rtol=1e-4, atol=1e-5)
    # lazy Adam (no catch-up) is measurably different: the test can fail
    if touch_steps != (n_steps,):
        assert np.abs(results[False] - ref).max() > 1e-3


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
