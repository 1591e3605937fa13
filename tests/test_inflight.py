"""Several batches in flight (slide.network.inflight): the setting's checks and resolution,
a run's counters and callbacks, its accuracy against one batch at a time, a run stopped and
resumed, divergence, and step records that only move forward."""
import math
import threading

import numba
import numpy as np
import pytest

from slide import SlideClassifier
from slide.kernels.atomic import claim_step, compare_exchange
from slide.kernels.jit import njit
from slide.network import block_step
from slide.network.inflight import (AUTO_MOST_IN_FLIGHT, BATCHES_A_WORKER, WARM_SHARE, Layout,
                                    batch_builds, check_batches_in_flight, plan_layout,
                                    resolve_batches_in_flight, warm_batches, warm_workers)
from slide.synthetic import generate
from slide.network.trainer import DivergenceError


@pytest.fixture(scope="module")
def data():
    return generate("tiny", scale=8, seed=0)


def _model(**kw):
    base = dict(random_state=0, neighbours=0, rerank=False, epochs=2, batch_size=64,
                shared_negatives=128, n_threads=2)
    base.update(kw)
    return SlideClassifier(**base)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "many", True, None, "2"])
def test_bad_batches_in_flight_is_a_clear_value_error(bad, data):
    with pytest.raises(ValueError, match="batches_in_flight"):
        _model(batches_in_flight=bad).fit(data[0], data[1])
    if not isinstance(bad, bool) and bad is not None:
        with pytest.raises(ValueError, match="batches_in_flight"):
            check_batches_in_flight(bad)


def test_resolution_follows_the_value_and_the_compiled_batch():
    assert resolve_batches_in_flight(8, 16, True) == 8
    assert resolve_batches_in_flight(8, 16, False) == 1             # no compiled batch
    assert resolve_batches_in_flight(np.int64(4), 16, True) == 4
    # auto: one a thread, at most AUTO_MOST_IN_FLIGHT (the threads then shared among them)
    assert resolve_batches_in_flight("auto", 1, True) == 1
    assert resolve_batches_in_flight("auto", 2, True) == 2
    assert resolve_batches_in_flight("auto", 16, True) == 4
    with pytest.raises(ValueError, match="batches_in_flight"):
        resolve_batches_in_flight(0, 16, False)                     # checked either way


def test_a_small_epoch_drops_idle_workers_and_keeps_each_batchs_threads():
    """The layout's batch threads are those of the workers asked for, whatever the epoch's
    batches: a one-batch epoch of a fit with a worker a thread trains one batch at a time on
    one thread (the one-thread build that ``batch_builds`` names), not on all of them."""
    assert plan_layout("auto", 2, 100, True) == Layout(2, 1)
    assert plan_layout("auto", 2, 1, True) == Layout(1, 1)          # was 1 batch on 2 threads
    assert plan_layout("auto", 16, 2, True) == Layout(2, 4)
    assert plan_layout(16, 16, 6, True) == Layout(6, 1)
    assert plan_layout(1, 8, 100, True) == Layout(1, 8)             # one at a time, on all
    assert plan_layout("auto", 8, 100, False) == Layout(1, 8)       # no compiled batch
    for value, n_threads in [("auto", 2), ("auto", 16), (16, 16), (8, 16), (1, 2), (3, 3)]:
        for n_batches in (1, 2, 5, 100):
            one_thread = plan_layout(value, n_threads, n_batches, True).threads_each == 1
            assert one_thread in batch_builds(value, n_threads), (value, n_threads, n_batches)


class _Calls:
    """Stands in for a kernel of ``block_step``, noting each call's kernel name."""

    def __init__(self, kernel, name, calls):
        self.kernel, self.name, self.calls = kernel, name, calls

    def __call__(self, *args):
        self.calls.append(self.name)
        return self.kernel(*args)

    @property
    def signatures(self):
        return self.kernel.signatures


def test_a_one_batch_epoch_on_two_threads_trains_on_the_one_thread_build(data, monkeypatch):
    """A fit of one batch an epoch with a worker a thread (auto, 2 threads) trains on the
    one-thread build of the compiled batch, the one its warm-up compiled (one batch at a time
    on both threads would call, and compile, the parallel build too); the fit leaves Numba's
    thread count as it found it."""
    calls = []
    for name in ("block_batch", "block_batch_one_thread"):
        monkeypatch.setattr(block_step, name, _Calls(getattr(block_step, name), name, calls))
    Xtr, Ytr, _, _ = data
    m = _model(epochs=2).fit(Xtr[:64], Ytr[:64])           # batch_size 64: one batch
    assert m.batches_ == 2 and set(calls) == {"block_batch_one_thread"}
    assert numba.get_num_threads() == 2


def test_more_workers_than_auto_take_over_after_a_warm_share_of_the_batches():
    assert warm_batches(AUTO_MOST_IN_FLIGHT, 1000) == 0          # as many as auto: no warm share
    assert warm_batches(16, 1000) == int(WARM_SHARE * 1000) > 0
    assert warm_workers(16) == AUTO_MOST_IN_FLIGHT and warm_workers(3) == 3
    # the builds of the compiled batch a fit takes (one thread a batch, or several)
    assert batch_builds(16, 16) == {False, True}     # 4 of 4 threads first, then 16 of one
    assert batch_builds(8, 16) == {False}            # 4 of 4, then 8 of 2
    assert batch_builds("auto", 16) == {False}
    assert batch_builds("auto", 2) == {True} and batch_builds(16, 2) == {True}
    assert batch_builds(1, 2) == {False} and batch_builds(1, 1) == {True}


def test_a_run_of_many_workers_starts_with_fewer(data):
    """8 in flight: the first quarter of the batches in waves of 4 workers, then of 8 (a
    wave holds BATCHES_A_WORKER batches a worker); the callback sees every batch once."""
    Xtr, Ytr = data[0], data[1]
    calls = []
    m = _model(batches_in_flight=8, batch_size=16, epochs=1)
    m.fit(Xtr, Ytr, callback=lambda model, info: calls.append(info["batches"]) and False)
    n_batches = math.ceil(Xtr.shape[0] / 16)
    assert sum(calls) == m.batches_ == n_batches and m.network_.workers == []
    warm, full = 4 * BATCHES_A_WORKER, 8 * BATCHES_A_WORKER
    n_warm = math.ceil(warm_batches(8, n_batches) / warm)         # waves before the switch
    assert calls[:n_warm] == [warm] * n_warm
    assert calls[n_warm:-1] == [full] * (len(calls) - n_warm - 1) and len(calls) > n_warm + 1
    assert np.isfinite(m.score(data[2], data[3]))


@njit(nogil=True)
def _claim(records, i, t):
    return claim_step(records, i, t)


@njit(nogil=True)
def _claim_steps(records, gate, first, n, replaced):
    """Claim steps first, first + 2, ... of row 0 once both threads are here (``gate``, an
    arrival count read and raised atomically); replaced[k]: the record each claim found."""
    while True:
        g = gate[0]
        if compare_exchange(gate, 0, g, g + 1) == g:
            break
    while compare_exchange(gate, 0, -1, -1) < 2:      # an atomic read: both have arrived
        pass
    for k in range(n):
        replaced[k] = claim_step(records, 0, first + 2 * k)


def test_a_step_record_is_claimed_atomically_and_never_goes_back():
    """claim_step records t and returns the record it replaced, or leaves a later record; two
    threads claiming steps of one row at once (odd ones and even ones) each catch up a missed
    step at most once: the claims that moved the record form one chain 0 -> t1 -> t2 -> ...,
    no two of them starting from the same record (which a read, then a write, would give)."""
    records = np.array([3, 7, 0], np.int32)
    assert _claim(records, 0, 5) == 3 and records[0] == 5
    assert _claim(records, 1, 5) == 7 and records[1] == 7        # a later step's record stays
    assert _claim(records, 2, 1) == 0 and records[2] == 1
    records, gate, n = np.zeros(1, np.int32), np.zeros(1, np.int64), 1_000_000
    replaced = [np.empty(n, np.int32) for _ in range(2)]
    threads = [threading.Thread(target=_claim_steps, args=(records, gate, 1 + j, n,
                                                           replaced[j])) for j in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    steps = np.concatenate([np.arange(1 + j, 1 + j + 2 * n, 2) for j in range(2)])
    last = np.concatenate(replaced).astype(np.int64)
    moved = last < steps
    order = np.argsort(steps[moved])
    steps, last = steps[moved][order], last[moved][order]
    assert records[0] == steps[-1] == 2 * n
    assert last[0] == 0 and (last[1:] == steps[:-1]).all()


def test_a_run_in_flight_counts_every_batch_once_and_calls_back_once_a_wave(data):
    Xtr, Ytr, Xte, Yte = data
    calls = []
    m = _model(batches_in_flight=3)
    m.fit(Xtr, Ytr, callback=lambda model, info: calls.append(dict(info)) and False)
    n_batches = math.ceil(Xtr.shape[0] / 64)
    assert m.batches_ == 2 * n_batches == m.optimizer_.t
    assert m.samples_ == 2 * Xtr.shape[0] and m.epoch_ == 2 and m.batch_in_epoch_ == 0
    assert sum(c["batches"] for c in calls) == m.batches_
    assert [c["batch"] for c in calls] == sorted(c["batch"] for c in calls)
    assert calls[-1]["batch"] == m.batches_ and len(calls) < m.batches_
    assert all(np.isfinite(c["loss"]) for c in calls)
    # nothing is left in flight: the workers went, every step record is at most the count
    net = m.network_
    assert net.workers == []
    assert (m.optimizer_.TW <= m.optimizer_.t).all() and (m.optimizer_.TB <= m.optimizer_.t).all()
    assert not net.GW.any() and not net.GB.any()


def test_in_flight_learns_what_one_batch_at_a_time_learns(data):
    Xtr, Ytr, Xte, Yte = data
    one = _model(batches_in_flight=1, epochs=4).fit(Xtr, Ytr)
    four = _model(batches_in_flight=4, epochs=4).fit(Xtr, Ytr)
    p1, p4 = one.score(Xte, Yte), four.score(Xte, Yte)
    assert p1 > 0.2 and abs(p4 - p1) < 0.05, (p1, p4)


def test_one_batch_in_flight_is_one_batch_at_a_time_bit_for_bit(data):
    """batches_in_flight=1 takes the loop of one batch at a time: with one thread two fits
    are the same bits (the golden fixtures' promise)."""
    Xtr, Ytr, _, _ = data
    a = _model(batches_in_flight=1, n_threads=1).fit(Xtr, Ytr)
    b = _model(batches_in_flight="auto", n_threads=1).fit(Xtr, Ytr)
    np.testing.assert_array_equal(a.network_.W, b.network_.W)
    np.testing.assert_array_equal(a.network_.B, b.network_.B)


def test_a_run_in_flight_stopped_and_resumed_finishes_its_batches(data):
    """A callback stops the run between waves (nothing in flight); the model resumes from
    there and ends where a run that went on ends, every batch counted once."""
    Xtr, Ytr, Xte, Yte = data
    m = _model(batches_in_flight=2)
    m.fit(Xtr, Ytr, callback=lambda model, info: info["batch"] >= 10)
    stopped_at = m.batches_
    assert m.stopped_ and 10 <= stopped_at < 2 * math.ceil(Xtr.shape[0] / 64)
    assert m.optimizer_.t == stopped_at
    m.fit(Xtr, Ytr, resume=True)
    assert m.batches_ == 2 * math.ceil(Xtr.shape[0] / 64) == m.optimizer_.t
    assert m.samples_ == 2 * Xtr.shape[0]
    assert m.score(Xte, Yte) > 0.2


def test_a_diverged_run_in_flight_raises(data):
    Xtr, Ytr, _, _ = data
    m = _model(batches_in_flight=2, optimizer="sgd", learning_rate=1e30, lr_schedule="constant")
    with pytest.raises(DivergenceError):
        m.fit(Xtr, Ytr)


def test_clear_gradients_clears_every_workers_buffers(data):
    from slide.network.worker import Worker
    Xtr, Ytr, _, _ = data
    net = _model(batches_in_flight=1, epochs=1).fit(Xtr, Ytr).network_
    net.prepare(64, 1, 8)
    net.workers = [Worker.allocate(net, 64, 1, 8)]
    for w in [net] + net.workers:
        w.GW[:3] = 1.0
        w.GB[:3] = 1.0
    net.clear_gradients()
    assert not any(w.GW.any() or w.GB.any() for w in [net] + net.workers)


def test_each_worker_runs_its_share_of_the_threads(data):
    from slide.network.inflight import InFlight
    Xtr, Ytr, _, _ = data
    m = _model(batches_in_flight=1, epochs=1).fit(Xtr, Ytr)
    old = numba.get_num_threads()
    try:
        fl = InFlight(m.network_, Layout(2, 1))
        assert fl.threads_each == 1 and fl.n_workers == 2 and len(m.network_.workers) == 1
        fl.close()
        assert m.network_.workers == []
    finally:
        numba.set_num_threads(old)
