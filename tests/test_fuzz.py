"""Fuzzing the input boundary (issue 28): bad input raises ValueError naming the problem, never
another exception, never a crash; valid input in any form gives the canonical input's result.

The validators run in this process under hypothesis; the entry points that reach a kernel run
in a subprocess (bench/fuzz.py's worker, one process for all cases, a death detected by its
return code) because a bounds error there kills the process."""
import os
import sys

import numpy as np
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slide.data import as_feature_matrix, as_label_matrix

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from bench import fuzz  # noqa: E402

N_ROWS, N_COLS = 4, 6


@st.composite
def raw_sparse(draw):
    """(format, data, ids, indptr-or-rows): raw arrays with ids anywhere in [-3, N_COLS + 3],
    any order, duplicates, empty rows, NaN / inf values."""
    n = draw(st.integers(0, 10))
    ids = draw(st.lists(st.integers(-3, N_COLS + 3), min_size=n, max_size=n))
    vals = draw(st.lists(st.one_of(st.floats(-5, 5, width=32), st.sampled_from(
        [np.nan, np.inf, -np.inf])), min_size=n, max_size=n))
    rows = sorted(draw(st.lists(st.integers(0, N_ROWS - 1), min_size=n, max_size=n)))
    fmt = draw(st.sampled_from(["csr", "csr_array", "csc", "coo"]))
    return fmt, np.array(vals, np.float32), np.array(ids, np.int64), np.array(rows, np.int64)


def _build(fmt, vals, ids, rows):
    if fmt == "coo":
        M = sp.coo_matrix((N_ROWS, N_COLS), dtype=np.float32)
        M.data, M.row, M.col = vals, rows.astype(np.int32), ids.astype(np.int32)
        return M
    if fmt == "csc":   # ids are row ids: the matrix is the transpose, columns = N_ROWS
        ptr = np.searchsorted(rows, np.arange(N_ROWS + 1))
        return sp.csc_matrix((vals, ids, ptr), shape=(N_COLS, N_ROWS))
    ptr = np.searchsorted(rows, np.arange(N_ROWS + 1))
    cls = sp.csr_array if fmt == "csr_array" else sp.csr_matrix
    return cls((vals, ids, ptr), shape=(N_ROWS, N_COLS))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw_sparse())
def test_feature_validator_accepts_exactly_the_valid_matrices(case):
    fmt, vals, ids, rows = case
    M = _build(fmt, vals, ids, rows)
    # CSC is built as the transpose (N_COLS rows): its ids are row ids, bound N_COLS too
    in_range = ids.size == 0 or (ids.min() >= 0 and ids.max() < N_COLS)
    finite = np.isfinite(vals).all()
    try:
        got = as_feature_matrix(M)
    except ValueError as exc:
        assert not (in_range and finite), f"valid input refused: {exc}"
        if not in_range:
            bad = int(ids[(ids < 0) | (ids >= N_COLS)][0])
            assert f"id {bad}," in str(exc) and "X" in str(exc)
        return
    assert in_range and finite, "invalid input accepted"
    shape = (N_COLS, N_ROWS) if fmt == "csc" else (N_ROWS, N_COLS)
    dense = np.zeros(shape, np.float64)
    if fmt == "csc":
        np.add.at(dense, (ids, np.repeat(np.arange(N_ROWS), np.diff(
            np.searchsorted(rows, np.arange(N_ROWS + 1))))), vals)
    else:
        np.add.at(dense, (rows, ids), vals)
    np.testing.assert_allclose(got.toarray(), dense.astype(np.float32), rtol=1e-6, atol=1e-6)
    assert got.has_sorted_indices and got.indices.dtype == np.int32


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.one_of(st.integers(-2, 9), st.floats(-1, 9),
                                   st.text(alphabet="ab x", max_size=1)),
                         max_size=4), min_size=1, max_size=5),
       st.sampled_from([None, 8]))
def test_label_validator_on_label_lists(lists, n_labels):
    ok = all(isinstance(v, int) or (isinstance(v, float) and v == int(v)) for l in lists
             for v in l) and all(int(v) >= 0 for l in lists for v in l
                                 if not isinstance(v, str))
    ok = ok and (n_labels is None or all(int(v) < n_labels for l in lists for v in l))
    try:
        with np.errstate(all="ignore"):
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                M = as_label_matrix(lists, n_labels=n_labels)
    except ValueError as exc:
        assert not ok, f"valid labels refused: {exc}"
        return
    assert ok, "invalid labels accepted"
    for i, l in enumerate(lists):
        assert sorted(M.indices[M.indptr[i]:M.indptr[i + 1]].tolist()) == sorted(
            {int(v) for v in l})


def test_entry_points_survive_fuzzed_input_in_a_subprocess():
    """Kernels, checkpoints, XC files and the config loader: 150 cases in one worker process
    (bench/fuzz.py; a killed worker is a crash, restarted after the case that killed it)."""
    summary = fuzz.run(150, seed=7)
    assert summary["cases_tried"] == 150
    assert summary["crashes"] == 0, summary["crash_cases"]
    assert summary["harness_errors"] == 0, summary["crash_cases"]
    assert summary["silent_wrong_results"] == 0, summary["findings"]
    assert summary["bad_exceptions"] == 0, summary["findings"]
    assert set(summary["by_entry_point"]) >= {"predict_topk", "predict_proba", "score",
                                              "read_xc", "write_xc", "config", "save_load"}
