"""Numba's threading layer (slide.kernels.threads): TBB where the ``tbb`` package installed its
library, the user's NUMBA_THREADING_LAYER otherwise respected."""
import os
import sys

import numpy as np
import pytest

from slide.kernels import threads


def test_an_installed_tbb_runs_the_parallel_kernels():
    """Where the tbb wheel put libtbb beside this Python, slide's parallel loops run on TBB
    (work stealing: a core busy with another job does not hold every loop)."""
    import numba
    from slide.network.block import split_forward_product
    from slide.network.extras import no_extras
    H = np.ones((4, 8), np.float32)
    WS = np.ones((6, 8), np.float32)
    Z = np.zeros((4, 6), np.float32)
    # a parallel kernel: the layer is chosen (no rows to gather: WS is given)
    split_forward_product(no_extras(H), np.zeros(0, np.int32), WS, np.zeros(0, np.float32), Z, 2)
    np.testing.assert_array_equal(Z, 8.0)
    if threads.TBB_PATH is None:
        pytest.skip("no tbb package in this environment (its wheels are x86-64 only)")
    if os.environ.get("NUMBA_THREADING_LAYER", "default") not in ("default", "tbb", "safe"):
        pytest.skip("NUMBA_THREADING_LAYER picks another layer")
    assert numba.threading_layer() == "tbb"


def test_the_users_layer_and_a_missing_library_leave_numba_alone(monkeypatch, tmp_path):
    monkeypatch.setenv("NUMBA_THREADING_LAYER", "omp")
    assert threads.preload_tbb() is None
    monkeypatch.delenv("NUMBA_THREADING_LAYER")
    for attr in ("prefix", "base_prefix"):
        monkeypatch.setattr(sys, attr, str(tmp_path))
    monkeypatch.setattr(threads.site, "USER_BASE", str(tmp_path))
    assert threads.preload_tbb() is None            # no lib/libtbb.so.12 there
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / threads.TBB_LIBRARY.get(sys.platform, "libtbb.so.12")).write_bytes(
        b"not a library")
    assert threads.preload_tbb() is None            # unloadable: skipped, not raised


def test_a_layer_other_than_tbb_is_warned_about_unless_chosen(monkeypatch):
    """Not TBB without the user choosing it (the tbb package missing): one warning, naming
    the layer and the remedy; none on one thread, on TBB, or for a layer the user set."""
    monkeypatch.delenv("NUMBA_THREADING_LAYER", raising=False)
    msg = threads.layer_warning(16, "omp")
    assert "'omp'" in msg and "pip install tbb" in msg and "16 threads" in msg
    assert threads.layer_warning(1, "omp") is None
    assert threads.layer_warning(16, "tbb") is None
    assert threads.layer_warning(16, None) is None
    monkeypatch.setenv("NUMBA_THREADING_LAYER", "omp")
    assert threads.layer_warning(16, "omp") is None
    monkeypatch.delenv("NUMBA_THREADING_LAYER")
    import numba
    monkeypatch.setattr(threads, "_WARNED", [])
    monkeypatch.setattr(numba, "threading_layer", lambda: "workqueue")
    with pytest.warns(RuntimeWarning, match="workqueue"):
        threads.warn_if_not_tbb(4)
    threads.warn_if_not_tbb(4)                  # once a process
    assert len(threads._WARNED) == 1
