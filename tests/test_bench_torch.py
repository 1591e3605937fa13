"""The PyTorch baseline's first layer: EmbeddingBag(sum, sparse) + SparseAdam moves only the
batch's feature rows; ``reset`` undoes the untimed warm-up step (run with the torch extra)."""
import importlib.util

import numpy as np
import pytest
import scipy.sparse as sp

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="PyTorch (the torch extra) is not installed")


def _model():
    from bench.baselines import torch_dense
    torch = torch_dense._import_torch(1)
    return torch_dense._TorchModel(torch, 20, 12, 16, 0.01, "glorot_normal+log_prior", 3,
                                   label_counts=np.arange(12), n_train=50)


def _batch():
    X = sp.csr_matrix((np.array([1.0, 2.0, 0.5, 1.5], np.float32), np.array([1, 4, 4, 7]),
                       np.array([0, 2, 4])), shape=(2, 20))
    Y = sp.csr_matrix((np.ones(3, np.float32), np.array([2, 5, 9]), np.array([0, 2, 3])),
                      shape=(2, 12))
    return X, Y


def test_embedding_bag_is_the_dense_product():
    m = _model()
    X, _ = _batch()
    logits = m._logits(X).detach().numpy()
    W0, b0 = m.emb.weight.detach().numpy(), m.b0.detach().numpy()
    h = np.maximum(X @ W0 + b0, 0)
    np.testing.assert_allclose(logits, h @ m.W1.detach().numpy() + m.b1.detach().numpy(),
                               rtol=1e-5, atol=1e-6)


def test_only_batch_rows_move_and_reset_restores():
    m = _model()
    X, Y = _batch()
    W0 = m.emb.weight.detach().numpy().copy()
    m.train_batch(X, Y)
    moved = np.flatnonzero(np.any(m.emb.weight.detach().numpy() != W0, axis=1))
    assert moved.tolist() == [1, 4, 7]
    W0b = m.emb.weight.detach().numpy().copy()
    X2 = sp.csr_matrix((np.ones(1, np.float32), np.array([9]), np.array([0, 1])), shape=(1, 20))
    m.train_batch(X2, Y[:1])                     # rows 1, 4, 7 keep still (lazy Adam)
    assert np.flatnonzero(np.any(m.emb.weight.detach().numpy() != W0b, axis=1)).tolist() == [9]
    m.reset()
    np.testing.assert_array_equal(m.emb.weight.detach().numpy(), W0)
    assert not m.sparse_opt.state and not m.opt.state


def _sampled_model(target="all"):
    from bench.baselines import torch_dense, torch_sampled
    torch = torch_dense._import_torch(1)
    return torch_sampled._TorchSampledModel(
        torch, 20, 12, 16, 0.01, "glorot_normal+log_prior", 3,
        {"num_sampled": 5, "target": target, "head": 1}, np.arange(12), 50)


def test_sampled_loss_is_tf_sampled_softmax():
    """Logits minus log expected counts, own label removed from the negatives, true label first;
    rows weighted 1/|y|, summed over the batch's rows and divided by the batch size."""
    from bench.common import label_targets
    m = _sampled_model()
    X, Y = _batch()
    rows, labels, w = label_targets(Y)
    negatives = np.array([11, 5, 0, 3, 8])        # holds row 0's label 5: an accidental hit
    neg_log_exp = np.array([0.0, -1.0, -2.0, -0.5, -3.0], np.float32)
    loss = float(m.batch_loss(X, rows, labels, w, negatives, neg_log_exp).detach())
    W0, b0 = m.emb.weight.detach().numpy(), m.b0.detach().numpy()
    W1, b1 = m.out_w.weight.detach().numpy(), m.out_b.weight.detach().numpy()[:, 0]
    h = np.maximum(X @ W0 + b0, 0)
    total = 0.0
    for r, y, wt in zip(rows, labels, w):
        true = h[r] @ W1[y] + b1[y] - m.candidates.log_expected(np.array([y]))[0]
        neg = [h[r] @ W1[j] + b1[j] - q for j, q in zip(negatives, neg_log_exp) if j != y]
        z = np.array([true] + neg, np.float64)
        total += wt * (np.log(np.exp(z - z.max()).sum()) + z.max() - true)
    assert loss == pytest.approx(total / X.shape[0], rel=1e-5)


def test_sampled_steps_move_only_the_touched_output_rows():
    m = _sampled_model(target="one")
    X, Y = _batch()
    W1 = m.out_w.weight.detach().numpy().copy()
    m.neg_rng = np.random.default_rng(5)
    state = m.neg_rng.bit_generator.state
    negatives, _ = m.candidates.draw(np.random.default_rng(5))
    m.neg_rng.bit_generator.state = state
    m.train_batch(X, Y)
    moved = set(np.flatnonzero(np.any(m.out_w.weight.detach().numpy() != W1, axis=1)))
    assert moved <= set(negatives) | {2, 5, 9} and set(negatives) <= moved
    m.reset()
    np.testing.assert_array_equal(m.out_w.weight.detach().numpy(), W1)
