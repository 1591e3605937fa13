"""The TensorFlow baseline's fairness mechanics (run when TensorFlow is installed: the bench
extra): the first layer is an embedding lookup with a row-sparse (lazy) Adam, the untimed
warm-up step is undone by ``reset``, and the outputs match a NumPy forward pass."""
import importlib.util

import numpy as np
import pytest
import scipy.sparse as sp

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                 reason="TensorFlow (the bench extra) is not installed")


def _model(sampled=None, lr=0.01):
    from bench.baselines import tf_dense
    tf = tf_dense._import_tf(1)
    counts = np.arange(12)
    return tf_dense._TFModel(tf, 20, 12, 16, lr, "glorot_normal+log_prior", 3, sampled=sampled,
                             label_counts=counts, n_train=50)


def _batch():
    X = sp.csr_matrix((np.array([1.0, 2.0, 0.5, 1.5], np.float32), np.array([1, 4, 4, 7]),
                       np.array([0, 2, 4])), shape=(2, 20))
    Y = sp.csr_matrix((np.ones(3, np.float32), np.array([2, 5, 9]), np.array([0, 2, 3])),
                      shape=(2, 12))
    return X, Y


def test_hidden_layer_is_the_dense_product():
    m = _model()
    X, _ = _batch()
    h = m._hidden(*[np.asarray(a) for a in m._sparse_args(X)]).numpy()
    np.testing.assert_allclose(h, np.maximum(X @ m.W0.numpy() + m.b0.numpy(), 0), rtol=1e-5)


def test_first_layer_adam_touches_only_the_batch_features():
    m = _model()
    X, Y = _batch()
    W0 = m.W0.numpy().copy()
    m.train_batch(X, Y)
    assert m.sparse_updates == 1                       # W0 only; the full softmax is dense
    moved = np.flatnonzero(np.any(m.W0.numpy() != W0, axis=1))
    assert moved.tolist() == [1, 4, 7]
    assert not m.m[0].numpy()[[0, 2, 3, 5]].any()     # untouched rows keep zero moments
    # a second batch on other features: rows 1, 4, 7 do not move again (lazy Adam; TF's own
    # Adam would keep moving them with their momentum)
    W0 = m.W0.numpy().copy()
    X2 = sp.csr_matrix((np.ones(1, np.float32), np.array([9]), np.array([0, 1])), shape=(1, 20))
    m.train_batch(X2, Y[:1])
    assert np.flatnonzero(np.any(m.W0.numpy() != W0, axis=1)).tolist() == [9]
    # row 9's first update at global step 2: m = (1-b1) g, v = (1-b2) g^2, bias correction by
    # the global step (as LazyAdam / SparseAdam): |move| = lr sqrt(1-b2^2)/(1-b1^2) (1-b1)/sqrt(1-b2)
    b1, b2 = 0.9, 0.999
    expect = 0.01 * np.sqrt(1 - b2**2) / (1 - b1**2) * (1 - b1) / np.sqrt(1 - b2)
    step = np.abs(m.W0.numpy()[9] - W0[9])
    assert step.max() > 0
    assert np.all(np.isclose(step, expect, rtol=1e-3) | (step == 0))


def test_sampled_output_layer_is_updated_row_sparsely():
    m = _model(sampled={"num_sampled": 2, "sampler": "unigram"})
    X, Y = _batch()
    W1 = m.W1.numpy().copy()
    m.train_batch(X, Y)
    assert m.sparse_updates == 3                       # W0, W1 and b1
    moved = set(np.flatnonzero(np.any(m.W1.numpy() != W1, axis=1)).tolist())
    assert {2, 5, 9} <= moved and len(moved) <= 3 + 2  # true labels + at most 2 negatives


def test_sampled_head_is_in_every_batch_with_expected_count_one():
    """--tf-head: the most frequent labels (counts = arange: the last ids) are among every
    batch's candidates with expected count 1; the other draws avoid them."""
    m = _model(sampled={"num_sampled": 5, "sampler": "unigram", "head": 3})
    _, Y = _batch()
    labels = m.tf.constant(np.array([2, 11, 9], np.int64))
    for _ in range(5):
        cand, t_exp, s_exp = (v.numpy() for v in m._candidates(labels))
        assert cand[:3].tolist() == [9, 10, 11] and len(set(cand.tolist())) == 5
        np.testing.assert_array_equal(s_exp[:3], 1.0)
        assert (s_exp[3:] < 1.0).all()
        # a true label in the head (11, 9) gets expected count 1, one outside (2) less
        assert t_exp[1, 0] == 1.0 and t_exp[2, 0] == 1.0 and t_exp[0, 0] < 1.0
    W1 = m.W1.numpy().copy()
    m.train_batch(*_batch())
    moved = set(np.flatnonzero(np.any(m.W1.numpy() != W1, axis=1)).tolist())
    assert {9, 10, 11} <= moved


def test_reset_undoes_the_warm_up_step():
    m = _model()
    X, Y = _batch()
    before = [v.numpy().copy() for v in m.vars]
    m.train_batch(X, Y)
    assert any(not np.array_equal(a, v.numpy()) for a, v in zip(before, m.vars))
    m.reset()
    for a, v in zip(before, m.vars):
        np.testing.assert_array_equal(a, v.numpy())
    assert float(m.b1p.numpy()) == 1.0 and not any(s.numpy().any() for s in m.m + m.v)
