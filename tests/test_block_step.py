"""The batched engine's batch as one compiled call (slide.network.block_step) against the
Python sequence of the same kernels (slide.network.block.forward_backward and update): the
same bits in every weight, moment, step record and stamp, and nothing applied when a loss is
not finite."""
import copy

import numba
import numpy as np
import pytest

from slide.network import block_step
from slide.network.optim import SparseOptimizer
from test_block import _net
from test_network import _data


def _state(net, opt):
    return {"W": net.W, "B": net.B, "out_stamp": net.out_stamp, "GW": net.GW, "GB": net.GB,
            **{a: getattr(opt, a) for a in ("MW", "VW", "MB", "VB", "TW", "TB")},
            "step_rates": opt.step_rates}


def _python_sequence(net, X, Y, rows, seed, serial, opt):
    """What ``Network.train_batch`` ran before the compiled step (and runs for the networks
    ``block_step.applies`` leaves out)."""
    losses = net.forward_backward(X, Y, rows, seed, serial)
    loss = float(losses.mean())
    if np.isfinite(loss):
        net.update(X, rows, serial, opt)
    return loss


@pytest.mark.parametrize("optimizer", ["adam", "lazy_adam", "sgd"])
@pytest.mark.parametrize("head", [0, 10])
def test_compiled_batch_is_the_python_sequence_bit_for_bit(optimizer, head):
    rng = np.random.default_rng(7)
    X, Y = _data(rng, 96, 40, 300, nnz=8, ny=3)
    net = _net("batched", "random", "softmax", False, 0, head=head)
    assert block_step.applies(net)
    opt = SparseOptimizer(optimizer, net.layout, 1e-2)
    old = numba.get_num_threads()
    # one thread: HOGWILD's racy adds into the first layer's bias gradient may drop an
    # update with two (by design), which would hide a real difference between the paths
    numba.set_num_threads(1)
    try:
        net.prepare(32, 1, 8)
        ref_net, ref_opt = copy.deepcopy(net), copy.deepcopy(opt)
        for b in range(5):
            # rows idle for a few batches, so the catch-up runs
            rows = ((np.arange(32) * (b + 2)) % 96).astype(np.int64)
            loss, _ = net.train_batch(X, Y, rows, 5, b + 1, opt)
            ref_loss = _python_sequence(ref_net, X, Y, rows, 5, b + 1, ref_opt)
            assert loss == ref_loss
        assert opt.t == ref_opt.t == 5
        got, want = _state(net, opt), _state(ref_net, ref_opt)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        assert not np.array_equal(net.W, _net("batched", "random", "softmax", False, 0,
                                               head=head).W)
    finally:
        numba.set_num_threads(old)


def test_compiled_batch_on_two_threads_is_the_python_sequence_but_for_the_racy_biases():
    """Two threads: a batch from the same state leaves every weight row, moment, step record
    and stamp bit for bit where the Python sequence leaves them. The first layer's biases
    may differ: their gradient is HOGWILD's racy adds, which now and then drop a sample's
    share on either path (two runs of one path differ there too)."""
    rng = np.random.default_rng(8)
    X, Y = _data(rng, 96, 40, 300, nnz=8, ny=3)
    net = _net("batched", "random", "softmax", False, 0)
    opt = SparseOptimizer("adam", net.layout, 1e-2)
    old = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        net.prepare(32, 2, 8)
        for b in range(3):
            net.train_batch(X, Y, ((np.arange(32) * 3 + b) % 96).astype(np.int64), 5, b + 1,
                            opt)
        numba.set_num_threads(2)
        ref_net, ref_opt = copy.deepcopy(net), copy.deepcopy(opt)
        rows = np.arange(32, 64, dtype=np.int64)
        net.train_batch(X, Y, rows, 5, 4, opt)
        _python_sequence(ref_net, X, Y, rows, 5, 4, ref_opt)
        got, want = _state(net, opt), _state(ref_net, ref_opt)
        for name in ("W", "MW", "VW", "TW", "TB", "out_stamp", "step_rates"):
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        first = slice(int(net.layout.b_off[0]), int(net.layout.b_off[1]))
        rest = np.ones(net.B.shape[0], bool)
        rest[first] = False
        np.testing.assert_array_equal(net.B[rest], ref_net.B[rest])
        np.testing.assert_allclose(net.B[first], ref_net.B[first], rtol=0, atol=0.05)
    finally:
        numba.set_num_threads(old)


def test_compiled_batch_applies_nothing_when_a_loss_is_not_finite():
    rng = np.random.default_rng(9)
    X, Y = _data(rng, 96, 40, 300, nnz=8, ny=3)
    net = _net("batched", "random", "softmax", False, 0)
    opt = SparseOptimizer("adam", net.layout, 1e-2)
    net.prepare(32, numba.get_num_threads(), 8)
    rows = np.arange(32, dtype=np.int64)
    net.train_batch(X, Y, rows, 5, 1, opt)
    # an input feature of the next batch's first row with an infinite weight: its hidden
    # layer overflows, its loss is NaN
    f = X.indices[X.indptr[32]]
    net.layout.weight_view(net.W, 0)[f] = np.inf
    before = {k: v.copy() for k, v in _state(net, opt).items()}
    loss, _ = net.train_batch(X, Y, rows + 32, 5, 2, opt)
    assert not np.isfinite(loss)
    assert opt.t == 1
    after = _state(net, opt)
    for name in ("W", "B", "MW", "VW", "MB", "VB", "TW", "TB", "out_stamp", "step_rates"):
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    # nothing is left in the gradient buffers for a resumed run's next step
    assert not net.GW.any() and not net.GB.any()


def test_compiled_batch_leaves_the_oracle_and_a_sparse_first_layer_to_python():
    net = _net("batched", "random", "softmax", False, 0)
    assert block_step.applies(net)
    net.oracle_m = 4
    assert not block_step.applies(net)
    sparse_first = _net("batched", "vanilla", "softmax", True, 0)
    assert not sparse_first.fused_first and not block_step.applies(sparse_first)


def test_the_compiled_mean_is_numpys_to_the_bit():
    """``block_batch`` reports the batch's mean loss as ``losses.mean()`` did (numpy's
    pairwise order), so a run's reported losses did not move."""
    rng = np.random.default_rng(0)
    for n in list(range(1, 140)) + [255, 256, 300, 1000, 1024, 4099, 70001]:
        for _ in range(5):
            a = rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3, n)
            assert block_step.pairwise_sum(a, 0, n) / n == a.mean(), n
