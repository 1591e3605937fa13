"""One-thread builds of parallel kernels (slide.kernels.one_thread): the same code without
parallel loops, calling the callees it is given, cached beside the kernel; a batch on one thread
takes the batch's one-thread build and leaves every weight, moment, step record and stamp bit
for bit where the parallel build leaves them."""
import numba
import numpy as np
import pytest
from numba import njit, prange

from slide.kernels.one_thread import one_thread
from slide.network import block_step
from slide.network.optim import SparseOptimizer
from test_block import _net
from test_block_step import _state
from test_network import _data


@njit(parallel=True)
def _scaled_sum(a):
    total = 0.0
    for i in prange(a.shape[0]):
        total += _scale(a[i])
    return total


@njit
def _scale(x):
    return 2.0 * x


@njit
def _other_scale(x):
    return 3.0 * x


def test_a_build_runs_the_same_code_without_parallel_loops_and_calls_its_callees():
    a = np.arange(10.0)
    build = one_thread(_scaled_sum)
    assert build(a) == _scaled_sum(a) == 90.0
    assert "parallel" not in build.targetoptions and _scaled_sum.targetoptions["parallel"]
    assert build.__name__ == "_scaled_sum_one_thread" and build.__module__ == __name__
    # the build's own loop: no call into Numba's thread pool
    launch = "numba_parallel_for"
    assert launch in _scaled_sum.inspect_llvm(_scaled_sum.signatures[0])
    assert launch not in build.inspect_llvm(build.signatures[0])
    assert one_thread(_scaled_sum, {"_scale": _other_scale})(a) == 135.0
    # the module's own binding is untouched
    assert _scaled_sum(a) == 90.0


def test_a_build_is_cached_where_its_kernel_is_and_names_only_what_the_kernel_calls():
    assert type(one_thread(block_step.block_batch)._cache).__name__ == "FunctionCache"
    assert type(one_thread(_scaled_sum)._cache).__name__ == "NullCache"
    with pytest.raises(ValueError, match="names no _not_called"):
        one_thread(_scaled_sum, {"_not_called": _other_scale})


@pytest.mark.parametrize("optimizer,head,sparse_first", [("adam", 0, False), ("adam", 10, False),
                                                         ("lazy_adam", 0, False),
                                                         ("sgd", 10, False),
                                                         ("adam", 0, True)])
def test_a_batch_on_one_thread_is_the_parallel_build_bit_for_bit(optimizer, head, sparse_first,
                                                                 monkeypatch):
    rng = np.random.default_rng(21)
    X, Y = _data(rng, 96, 40, 300, nnz=8, ny=3)
    sampler = "vanilla" if sparse_first else "random"
    net, ref_net = (_net("batched", sampler, "softmax", sparse_first, 0, head=head)
                    for _ in range(2))
    opt, ref_opt = (SparseOptimizer(optimizer, net.layout, 1e-2) for _ in range(2))
    built, ran = block_step.block_batch_one_thread, []

    def one_thread_batch(call):
        ran.append(call)
        return built(call)
    monkeypatch.setattr(block_step, "block_batch_one_thread", one_thread_batch)
    old = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        for n in (net, ref_net):
            n.prepare(32, 1, 8)
        for b in range(4):
            # rows idle for a few batches, so the catch-up runs
            rows = ((np.arange(32) * (b + 2)) % 96).astype(np.int64)
            calls = [block_step.bind(n, block_step.claim(n, X, Y, rows, 5, b + 1, o), X)
                     for n, o in ((net, opt), (ref_net, ref_opt))]
            assert calls[0].sched.n_threads == 1
            got = block_step.run_batch(calls[0])
            assert ran == [calls[0]]            # run_batch took the one-thread build
            ran.clear()
            want = block_step.block_batch(calls[1])
            assert got[0] and got == want
        got, want = _state(net, opt), _state(ref_net, ref_opt)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        assert opt.t == 4 and not np.array_equal(net.W, _net("batched", sampler, "softmax",
                                                            sparse_first, 0, head=head).W)
    finally:
        numba.set_num_threads(old)
