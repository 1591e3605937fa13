"""``time_budget``: fit stops when its training seconds reach the budget, with the learning-rate
schedule planned to end there (the decay follows the clock or the batch count, whichever is
further along). The clock is replaced by a fake one that advances a fixed step per reading,
so these runs are deterministic."""
import math

import numpy as np
import pytest

from slide.network import trainer
from slide.estimator import SlideClassifier
from slide.warmup import tiny_data

from conftest import FakeClock

# tiny_data: 40 points; batch 8 -> 5 batches per epoch
# neighbours=0: train_seconds_ is then the fake clock alone (the vote's memory is built after
# the last batch, on the real clock)
TINY = dict(neighbours=0, hidden_sizes=(8,), L=2, K=2, range_pow=6, sampler_budget=16,
            shared_negatives=8,
            batch_size=8, n_threads=1, random_state=0, rehash_period=1000,
            rebuild_period=1000)


def fit_with_clock(monkeypatch, step, **kw):
    model = SlideClassifier(**TINY, **kw)
    model._warm_up()        # compile on the real clock, outside the fake one
    monkeypatch.setattr(trainer, "time", FakeClock(step))
    seen = []
    model.fit(*tiny_data(), callback=lambda m, info: seen.append(m.optimizer_.learning_rate))
    return model, np.array(seen)


def test_budget_stops_fit_once_the_seconds_are_spent(monkeypatch):
    # 1 s per batch, 7 s budget, 4 epochs of 5 batches: stops after the 7th batch
    model, seen = fit_with_clock(monkeypatch, 1.0, epochs=4, time_budget=7.0,
                                 learning_rate=1e-2, lr_schedule="cosine")
    assert model.budget_spent_ and not model.stopped_
    assert model.batches_ == 7 and len(seen) == 7
    assert model.train_seconds_ == pytest.approx(7.0)
    assert (model.epoch_, model.batch_in_epoch_) == (1, 2)
    assert not model.optimizer_.pending          # synced: ready for inference
    # the cosine follows the clock: batch k (1-based) has spent k - 1 of the 7 seconds
    expected = [1e-2 * 0.5 * (1 + math.cos(math.pi * (k - 1) / 7)) for k in range(1, 8)]
    np.testing.assert_allclose(seen, expected, rtol=1e-6)


def test_budget_larger_than_the_epochs_changes_nothing(monkeypatch):
    # the epochs end first: the schedule follows the batch count, exactly as without a budget
    a, seen_a = fit_with_clock(monkeypatch, 1e-3, epochs=2, learning_rate=1e-2)
    b, seen_b = fit_with_clock(monkeypatch, 1e-3, epochs=2, learning_rate=1e-2,
                               time_budget=1e6)
    assert not b.budget_spent_ and b.epoch_ == 2 and b.batches_ == 10
    np.testing.assert_array_equal(seen_a, seen_b)
    np.testing.assert_array_equal(a.network_.W, b.network_.W)


def test_constant_schedule_with_budget_keeps_its_rate(monkeypatch):
    model, seen = fit_with_clock(monkeypatch, 1.0, epochs=3, time_budget=4.0,
                                 learning_rate=3e-3, lr_schedule="constant")
    assert model.budget_spent_ and model.batches_ == 4
    np.testing.assert_allclose(seen, 3e-3)


def test_budget_on_the_real_clock_stops_before_the_epochs():
    X, Y = tiny_data()
    model = SlideClassifier(**TINY, epochs=50, time_budget=1e-6).fit(X, Y)
    assert model.budget_spent_ and model.batches_ == 1 and model.epoch_ == 0
    assert model.predict_topk(X, k=2).shape == (X.shape[0], 2)


@pytest.mark.parametrize("value", [0, -1.0, "10", float("nan"), True])
def test_bad_time_budget_is_named(value):
    with pytest.raises(ValueError, match="time_budget"):
        SlideClassifier(**TINY, time_budget=value).fit(*tiny_data())


def test_budget_survives_a_checkpoint(tmp_path):
    import slide
    X, Y = tiny_data()
    model = SlideClassifier(**TINY, epochs=1, time_budget=120.0).fit(X, Y)
    model.save(tmp_path / "m.slide")
    assert slide.load(tmp_path / "m.slide").time_budget == 120.0


def test_resuming_a_spent_budget_trains_nothing(monkeypatch):
    model, _ = fit_with_clock(monkeypatch, 1.0, epochs=4, time_budget=3.0)
    W = model.network_.W.copy()
    model.fit(*tiny_data(), resume=True)
    assert model.budget_spent_ and model.batches_ == 3
    np.testing.assert_array_equal(model.network_.W, W)
