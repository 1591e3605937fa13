"""Helpers shared by test modules."""
import os
import sys

import pytest


def _cpus_available():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:       # not Linux
        return os.cpu_count() or 1


# The two-thread tests (HOGWILD against one thread) need a pool of 2 Numba threads. Numba sizes
# its pool from the CPUs this process may run on (sched_getaffinity: 1 under a one-CPU cpuset or
# taskset, even on a 2-core machine) or from NUMBA_NUM_THREADS, read once when numba is first
# imported -- which is after this file. So the suite asks for at least 2; on one CPU the two
# threads interleave, which is all those tests need (they compare results, not times).
assert "numba" not in sys.modules, "numba was imported before tests/conftest.py"
if int(os.environ.get("NUMBA_NUM_THREADS") or _cpus_available()) < 2:
    os.environ["NUMBA_NUM_THREADS"] = "2"


@pytest.fixture(scope="module")
def tiny():
    """The ``tiny`` synthetic preset (seed 0): (X_train, Y_train, X_test, Y_test), generated
    afresh for each module that asks for it."""
    from slide.synthetic import generate
    return generate("tiny", seed=0)


class FakeClock:
    """Stands in for the ``time`` module inside ``slide.network.trainer`` (monkeypatch.setattr(trainer,
    "time", FakeClock(step))): every perf_counter() reading is ``step`` seconds after the
    previous one, so one batch (two readings) costs ``step`` seconds of ``train_seconds_`` and
    runs with a ``time_budget`` are deterministic."""

    def __init__(self, step):
        self.now = 0.0
        self.step = step

    def perf_counter(self):
        self.now += self.step
        return self.now


@pytest.fixture
def rewrite_checkpoint(tmp_path):
    """``write(name, meta, arrays)``: a checkpoint file in tmp_path with these metadata and
    arrays (the array listing made to match), for tests that damage a saved model."""
    from slide.persist import checkpoint

    def write(name, meta, arrays):
        meta = dict(meta, arrays={k: [list(v.shape), str(v.dtype)] for k, v in arrays.items()})
        with open(tmp_path / name, "wb") as f:
            checkpoint._write_arrays(f, meta, arrays)
        return tmp_path / name
    return write
