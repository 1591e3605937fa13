"""The batched engine's batch as one compiled call (slide.network.block_step): the same bits
as its two halves run apart (``forward_backward``, then ``update``) and on another worker's
scratch (``slide.network.worker``), in every weight, moment, step record and stamp; nothing
applied when a loss is not finite."""
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
    """The batch's two halves, apart (what tests and diagnostics run to read the gradients
    in between)."""
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


def test_every_batched_network_takes_the_compiled_batch():
    net = _net("batched", "random", "softmax", False, 0)
    assert block_step.applies(net)
    sparse_first = _net("batched", "vanilla", "softmax", True, 0)
    assert not sparse_first.fused_first and block_step.applies(sparse_first)
    assert not block_step.applies(_net("per_sample", "random", "softmax", False, 0))


@pytest.mark.parametrize("sparse_first", [False, True])
def test_a_worker_trains_a_batch_as_the_network_does_bit_for_bit(sparse_first):
    """A batch bound to another worker's scratch (``Worker.allocate``, as a run with several
    batches in flight binds it) leaves the model where the network's own scratch leaves it:
    the worker holds every array the batch writes besides the model, gradients included
    (a sparse first layer: its rows' gradient goes through the worker's GW)."""
    from slide.network.worker import Worker
    rng = np.random.default_rng(12)
    X, Y = _data(rng, 96, 40, 300, nnz=8, ny=3)
    sampler = "vanilla" if sparse_first else "random"
    net, ref_net = (_net("batched", sampler, "softmax", sparse_first, 0) for _ in range(2))
    opt, ref_opt = (SparseOptimizer("adam", net.layout, 1e-2) for _ in range(2))
    old = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        for n in (net, ref_net):
            n.prepare(32, 1, 8)
            if n.uses_tables:
                n.build_indices()
        worker = Worker.allocate(net, 32, 1, 8)
        for b in range(4):
            rows = ((np.arange(32) * (b + 2)) % 96).astype(np.int64)
            call = block_step.bind(net, block_step.claim(net, X, Y, rows, 5, b + 1, opt), X,
                                   worker)
            ok, loss, _ = block_step.block_batch(call)
            ref_loss, _ = ref_net.train_batch(X, Y, rows, 5, b + 1, ref_opt)
            assert ok and loss == ref_loss
        got, want = _state(net, opt), _state(ref_net, ref_opt)
        for name in want:
            if name not in ("out_stamp", "GW", "GB"):
                np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        # the worker's own stamps and (cleared) gradient buffers; the network's untouched
        np.testing.assert_array_equal(worker.out_stamp, ref_net.out_stamp)
        assert not net.out_stamp.any() and not worker.GW.any() and not worker.GB.any()
    finally:
        numba.set_num_threads(old)


def test_the_compiled_mean_is_numpys_to_the_bit():
    """``block_batch`` reports the batch's mean loss as ``losses.mean()`` did (numpy's
    pairwise order), so a run's reported losses did not move."""
    rng = np.random.default_rng(0)
    for n in list(range(1, 140)) + [255, 256, 300, 1000, 1024, 4099, 70001]:
        for _ in range(5):
            a = rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3, n)
            assert block_step.pairwise_sum(a, 0, n) / n == a.mean(), n


def test_two_hidden_layers_take_the_one_layer_compiled_batch():
    """With two hidden layers the first layer's deltas reach the row steps as whole rows (the
    block's copy, ``block_step.first_deltas``): the batch is the compiled specialisation one
    hidden layer uses (a column slice of the deltas was a second one, with unvectorised row
    steps), and its update is the per-sample reference's to float32 tolerance."""
    from slide.network import Network
    from test_block import C, LSH
    rng = np.random.default_rng(3)
    X, Y = _data(rng, 96, 40, C, nnz=8, ny=3)
    old = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        one = _net("batched", "random", "softmax", False, 0)
        one.prepare(32, 1, 8)
        one.train_batch(X, Y, np.arange(32, dtype=np.int64), 5, 1,
                        SparseOptimizer("adam", one.layout, 1e-2))
        n_compiled = len(block_step.block_batch_one_thread.signatures)
        nets = {engine: Network((40, 16, 12, C), [False, False, True], [0, 0, 0], seed=3,
                                lsh=dict(LSH, sampler="random"), shared_negatives=30,
                                correct=True, negative_power=1.0, engine=engine)
                for engine in ("batched", "per_sample")}
        opts = {e: SparseOptimizer("adam", n.layout, 1e-2) for e, n in nets.items()}
        for net in nets.values():
            net.prepare(32, 1, 8)
        first, _ = block_step.first_deltas(nets["batched"].block, nets["batched"].sc.a_off, 32)
        assert first.flags.c_contiguous and first.shape == (32, 16)
        for b in range(3):
            rows = ((np.arange(32) * (b + 2)) % 96).astype(np.int64)
            losses = [net.train_batch(X, Y, rows, 5, b + 1, opts[e])[0]
                      for e, net in nets.items()]
            assert losses[0] == pytest.approx(losses[1], rel=1e-5)
        assert len(block_step.block_batch_one_thread.signatures) == n_compiled
        np.testing.assert_allclose(nets["batched"].W, nets["per_sample"].W, rtol=1e-4,
                                   atol=1e-6)
        assert not np.array_equal(nets["batched"].W[:16 * 40], Network(
            (40, 16, 12, C), [False, False, True], [0, 0, 0], seed=3, engine="batched",
            lsh=dict(LSH, sampler="random"), shared_negatives=30, correct=True,
            negative_power=1.0).W[:16 * 40])
    finally:
        numba.set_num_threads(old)
