"""Helpers shared by test modules."""


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
