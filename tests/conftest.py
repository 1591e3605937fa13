"""Helpers shared by test modules."""
import os
import subprocess
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


# A cold kernel cache (a fresh clone) makes most of the suite's time Numba compiling, one kernel
# after another on one core. The README's test command runs the suite in one process a core
# (pytest-xdist, ``-n auto``, a test file per process at a time), so that the kernels compile
# on every core. Run in one process (no ``-n``), for at least this many tests, a second process
# compiles the kernels of a default ``SlideClassifier`` fit into the cache meanwhile
# (``warmup.warm_up``, which starts its own helper for the stages after the network): the
# tests that reach them later load them instead. SLIDE_TEST_PRECOMPILE=0 turns it off.
PRECOMPILE_MIN_TESTS = 200

# Under -n every core already runs a test process: a fit's compile helper (slide.warmup
# .start_helper) would only be one process more on those cores, compiling the stages after the
# network whether or not that process's tests ever reach them. Tests of the helper say so
# themselves (monkeypatch, a subprocess's env).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("SLIDE_COMPILE_HELPER", "0")


def pytest_configure(config):
    # Most of a cold suite is Numba compiling, in every test, not only in a fit's warm-up: the
    # test process runs Python's cyclic collector as a warm-up's compile does
    # (``warmup.COMPILE_GC_THRESHOLDS``; docs/design.md, "Python's collector during a compile").
    import gc
    from slide import warmup
    gc.set_threshold(*warmup.COMPILE_GC_THRESHOLDS)


def pytest_collection_finish(session):
    if len(session.items) < PRECOMPILE_MIN_TESTS or _cpus_available() < 2 or \
            os.environ.get("SLIDE_TEST_PRECOMPILE", "1") == "0" or \
            os.environ.get("PYTEST_XDIST_WORKER"):
        return
    from slide import warmup
    if warmup.ranking_cached():
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    code = "import slide, slide.warmup as w; w.warm_up(slide.SlideClassifier())"
    session.config.slide_precompile = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=env)


def pytest_sessionfinish(session):
    proc = getattr(session.config, "slide_precompile", None)
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


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
