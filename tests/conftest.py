"""Helpers shared by test modules."""
import pytest


@pytest.fixture(scope="module")
def tiny():
    """The ``tiny`` synthetic preset (seed 0): (X_train, Y_train, X_test, Y_test), generated
    afresh for each module that asks for it."""
    from slide.synthetic import generate
    return generate("tiny", seed=0)


class FakeClock:
    """Stands in for the ``time`` module inside ``slide.trainer`` (monkeypatch.setattr(trainer,
    "time", FakeClock(step))): every perf_counter() reading is ``step`` seconds after the
    previous one, so one batch (two readings) costs ``step`` seconds of ``train_seconds_`` and
    runs with a ``time_budget`` are deterministic."""

    def __init__(self, step):
        self.now = 0.0
        self.step = step

    def perf_counter(self):
        self.now += self.step
        return self.now
