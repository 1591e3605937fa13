"""``input_dropout``: each training sample's input values are masked (inverted dropout) by a
mask drawn from (seed, batch serial, sample position), the same in its forward and backward
pass; 0 leaves training as it was (tests/test_golden.py pins that bit for bit)."""
import numpy as np
import pytest

from slide._rng import STREAM_INPUT_DROPOUT, STREAM_SERIAL_STRIDE, stream_seed, uniform
from slide.estimator import SlideClassifier
from slide.warmup import tiny_data

TINY = dict(hidden_sizes=(8,), L=2, K=2, range_pow=6, sampler_budget=16, shared_negatives=8,
            batch_size=8, epochs=1, n_threads=1, random_state=0)


def masked_copy(X, rows, p, seed, serial):
    """X with the rows of the batch masked as the kernel masks them (kept values scaled);
    dropped values stay as explicit zeros, so the touched features are the same."""
    Xm = X.copy()
    keep = np.float32(1.0 / (1.0 - p))
    for s, r in enumerate(rows):
        rng = np.uint64(stream_seed(np.uint64(seed),
                                    np.int64(STREAM_INPUT_DROPOUT + serial * STREAM_SERIAL_STRIDE),
                                    np.int64(s)))
        for j in range(Xm.indptr[r], Xm.indptr[r + 1]):
            rng, u = uniform(rng)
            rng = np.uint64(rng)
            Xm.data[j] = np.float32(0.0) if u < p else Xm.data[j] * keep
    return Xm


@pytest.mark.parametrize("sampler", ["random", "vanilla"])
def test_gradient_is_the_gradient_of_the_masked_input(sampler):
    X, Y = tiny_data()
    X.indptr = X.indptr.astype(np.int64)
    Y.indptr = Y.indptr.astype(np.int64)
    model = SlideClassifier(**TINY, sampler=sampler, input_dropout=0.5).fit(X, Y)
    net = model.network_
    rows = np.arange(3, 11, dtype=np.int64)
    seed, serial = net.seed, 7

    def fresh():
        # the same batch serial again: clear the active-set stamps of the previous call
        net.GW[:] = 0.0
        net.sc.marks[:] = 0
    fresh()
    loss_drop = net.forward_backward(X, Y, rows, seed, serial).copy()
    g_drop = net.GW.copy()
    fresh()
    net.input_dropout = 0.0
    Xm = masked_copy(X, rows, 0.5, seed, serial)
    assert 0 < (Xm.data == 0).sum() < X.nnz       # some values dropped, not all
    loss_masked = net.forward_backward(Xm, Y, rows, seed, serial).copy()
    np.testing.assert_allclose(loss_drop, loss_masked, rtol=1e-6)
    np.testing.assert_allclose(g_drop, net.GW, rtol=1e-5, atol=1e-7)
    fresh()
    loss_plain = net.forward_backward(X, Y, rows, seed, serial)
    assert not np.allclose(loss_plain, loss_drop)   # the mask did change the sample


def test_dropout_changes_training_and_is_reproducible():
    X, Y = tiny_data()
    plain = SlideClassifier(**TINY).fit(X, Y)
    a = SlideClassifier(**TINY, input_dropout=0.3).fit(X, Y)
    b = SlideClassifier(**TINY, input_dropout=0.3).fit(X, Y)
    np.testing.assert_array_equal(a.network_.W, b.network_.W)
    assert not np.array_equal(a.network_.W, plain.network_.W)


def test_zero_dropout_is_the_plain_run():
    X, Y = tiny_data()
    plain = SlideClassifier(**TINY).fit(X, Y)
    zero = SlideClassifier(**TINY, input_dropout=0.0).fit(X, Y)
    np.testing.assert_array_equal(plain.network_.W, zero.network_.W)


@pytest.mark.parametrize("kw, word", [(dict(input_dropout=1.0), "input_dropout"),
                                      (dict(input_dropout=-0.1), "input_dropout"),
                                      (dict(input_dropout="0.2"), "input_dropout"),
                                      (dict(input_dropout=0.2, sampler="dense"),
                                       "input_dropout")])
def test_bad_input_dropout_is_named(kw, word):
    with pytest.raises(ValueError, match=word):
        SlideClassifier(**TINY, **kw).fit(*tiny_data())


def test_checkpoint_keeps_it(tmp_path):
    import slide
    model = SlideClassifier(**TINY, input_dropout=0.25).fit(*tiny_data())
    model.save(tmp_path / "m.slide")
    back = slide.load(tmp_path / "m.slide")
    assert back.input_dropout == 0.25 and back.network_.input_dropout == 0.25
