"""Tests of slide.data: XC / split / libsvm readers, the writer, validation and batching."""
import functools

import numpy as np
import pytest
import scipy.sparse as sp

import slide
from slide import data as D
from slide.data import (
    DataFormatError,
    as_feature_matrix,
    as_label_matrix,
    iterate_minibatches,
    read_libsvm,
    read_split,
    read_xc,
    write_xc,
)


@pytest.fixture(params=[True, False], ids=["kernel", "numpy"])
def read(request):
    """``read_xc`` by the parser kernel, or by NumPy first (``slide.data.xc_numpy``, which
    hands what it does not take to the kernel): the same matrices and errors either way."""
    return functools.partial(read_xc, use_kernel=request.param)


def _write(tmp_path, text, name="d.txt"):
    p = tmp_path / name
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return p


def _assert_canonical(M, dtype=np.float32):
    assert sp.isspmatrix_csr(M) or M.format == "csr"
    assert M.data.dtype == dtype
    assert M.indices.dtype == np.int32
    assert M.has_sorted_indices
    for i in range(M.shape[0]):
        row = M.indices[M.indptr[i]:M.indptr[i + 1]]
        assert np.all(np.diff(row) > 0)


def _same(A, B):
    """Bit-exact equality of two CSR matrices."""
    assert A.shape == B.shape
    np.testing.assert_array_equal(A.indptr, B.indptr)
    np.testing.assert_array_equal(A.indices, B.indices)
    np.testing.assert_array_equal(A.data.view(np.uint32), B.data.view(np.uint32))


def _random_xy(rng, n=300, d=40, L=25):
    X = sp.random(n, d, density=0.15, format="csr", dtype=np.float32, random_state=rng)
    kind = rng.integers(0, 4, X.nnz)
    vals = np.where(kind == 0, rng.uniform(0, 1, X.nnz),
                    np.where(kind == 1, np.round(rng.uniform(-5, 5, X.nnz), 3),
                             rng.standard_normal(X.nnz) * 10.0 ** rng.integers(-44, 38, X.nnz)))
    X.data = vals.astype(np.float32)
    X.data[:5] = np.array([np.float32(1.4e-45), -0.0, np.finfo(np.float32).max,
                           np.finfo(np.float32).tiny, 1e-40], dtype=np.float32)
    X = X.tolil()
    X[3, :] = 0  # a point with no features
    X[7, :] = 0
    X = X.tocsr()
    X.eliminate_zeros()
    Y = sp.random(n, L, density=0.08, format="csr", random_state=rng)
    Y.data[:] = 1
    Y = Y.tolil()
    Y[5, :] = 0  # no labels
    Y[7, :] = 0  # neither labels nor features
    Y = Y.tocsr()
    Y.eliminate_zeros()
    return X, Y


# ---------------------------------------------------------------------------------------------
# round trip and the happy paths


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_round_trip_exact(read, tmp_path, seed):
    rng = np.random.default_rng(seed)
    X, Y = _random_xy(rng)
    p = tmp_path / "rt.txt"
    write_xc(p, X, Y)
    X2, Y2 = read(p)
    _assert_canonical(X2)
    _assert_canonical(Y2)
    _same(X2, as_feature_matrix(X))
    _same(Y2, as_label_matrix(Y))
    assert np.all(Y2.data == 1)
    assert X2.getrow(7).nnz == 0 and Y2.getrow(7).nnz == 0
    assert Y2.getrow(5).nnz == 0
    # writing again gives the same bytes
    q = tmp_path / "rt2.txt"
    write_xc(q, X2, Y2)
    assert q.read_bytes() == p.read_bytes()


def test_writer_line_shapes(tmp_path):
    X = sp.csr_matrix(np.array([[0, 0.5, 0], [0, 0, 0], [0.25, 0, 3], [0, 0, 0]], np.float32))
    Y = [[2, 0], [1], [], []]
    p = tmp_path / "w.txt"
    write_xc(p, X, Y, n_labels=3)
    assert p.read_text() == "4 3 3\n0,2 1:0.5\n1\n 0:0.25 2:3\n\n"


def test_read_xc_handwritten(read, tmp_path):
    text = ("4 6 5\n"
            "3,1 0:0.5 4:1e-3\n"
            " 2:-2.5\n"  # no labels
            "\n"  # neither
            "4,4 5:+.75 1:2.\r\n"  # repeated label, unsorted features, CRLF
            "\n  \n")  # trailing blank lines are fine
    X, Y = read(_write(tmp_path, text))
    _assert_canonical(X)
    _assert_canonical(Y)
    assert X.shape == (4, 6) and Y.shape == (4, 5)
    np.testing.assert_array_equal(X.toarray(), np.array(
        [[0.5, 0, 0, 0, 1e-3, 0], [0, 0, -2.5, 0, 0, 0], [0] * 6, [0, 2.0, 0, 0, 0, 0.75]],
        np.float32))
    np.testing.assert_array_equal(Y.toarray(), np.array(
        [[0, 1, 0, 1, 0], [0] * 5, [0] * 5, [0, 0, 0, 0, 1]], np.float32))


def test_unsorted_lines_sort_with_their_values(read, tmp_path):
    """Lines whose feature ids come in any order (some values hard to parse, handed to Python
    and moved with their ids) and whose labels repeat read as the sorted, deduplicated rows."""
    rng = np.random.default_rng(12)
    n_rows, n_x, n_y = 60, 500, 40
    lines, want_x, want_y = [], np.zeros((n_rows, n_x), np.float32), np.zeros((n_rows, n_y))
    for r in range(n_rows):
        ids = rng.choice(n_x, rng.integers(0, 70), replace=False)
        vals = [f"{v:.20f}" if rng.random() < 0.3 else f"{v:.3f}"
                for v in rng.uniform(0.1, 9.0, ids.shape[0])]
        labels = rng.integers(0, n_y, rng.integers(1, 9))
        want_x[r, ids] = [np.float32(float(v)) for v in vals]
        want_y[r, labels] = 1.0
        lines.append(",".join(map(str, labels)) + " "
                     + " ".join(f"{i}:{v}" for i, v in zip(ids, vals)))
    X, Y = read(_write(tmp_path, f"{n_rows} {n_x} {n_y}\n" + "\n".join(lines) + "\n"))
    _assert_canonical(X)
    _assert_canonical(Y)
    np.testing.assert_array_equal(X.toarray(), want_x)
    np.testing.assert_array_equal(Y.toarray(), want_y)


def test_value_parsing_matches_python_float(read, tmp_path):
    rng = np.random.default_rng(5)
    toks = ["0", "-0", "1", "0.1", "1e-45", "7e-46", "3.4028235e38", "1.17549435e-38",
            "123456789012345678901234567890", "0.000000000000000000000000000000123",
            "1.00000005960464477539062500000001", "1.0000000596046447753906249999",
            "9007199254740993", "4.35", "1E5", "-2.5e+3", ".5", "5.", "+1"]
    toks += [repr(float(v)) for v in rng.standard_normal(200) * 10.0 ** rng.integers(-30, 30, 200)]
    toks += [f"{v:.20f}" for v in rng.uniform(0, 1, 50)]
    lines = [f"0 0:{t}" for t in toks]
    p = _write(tmp_path, f"{len(lines)} 1 1\n" + "\n".join(lines) + "\n")
    X, _ = read(p)
    expect = np.array([np.float32(float(t)) for t in toks], np.float32)
    assert np.all(np.diff(X.indptr) == 1)  # one stored entry per row, explicit zeros kept
    got = X.data
    np.testing.assert_array_equal(got.view(np.uint32), expect.view(np.uint32))


def test_small_chunks_and_long_lines(tmp_path, monkeypatch):
    """Chunk boundaries, a line longer than the buffer, and many slow-path values."""
    monkeypatch.setattr(D.xc, "_CHUNK", 64)
    monkeypatch.setattr(D.xc, "_HARD_CAP", 300)
    rng = np.random.default_rng(3)
    X, Y = _random_xy(rng, n=60, d=400, L=30)
    X = X.tolil()
    X[10, :] = rng.uniform(0.1, 1, 400)  # a ~4 KB line
    X = X.tocsr()
    p = tmp_path / "c.txt"
    write_xc(p, X, Y)
    X2, Y2 = read_xc(p, use_kernel=True)
    _same(X2, as_feature_matrix(X))
    _same(Y2, as_label_matrix(Y))
    # long decimal expansions all take the Python slow path; more than _HARD_CAP of them
    vals = rng.uniform(0, 1, 40 * 30)
    lines = [" " + " ".join(f"{j}:{vals[i * 30 + j]:.25f}" for j in range(30)) for i in range(40)]
    X3, _ = read_xc(_write(tmp_path, "40 30 1\n" + "\n".join(lines)), use_kernel=True)
    np.testing.assert_array_equal(X3.toarray().ravel(), vals.astype(np.float32))
    # one line with more slow-path values than the kernel's buffer holds
    vals = rng.uniform(0, 1, 700)
    line = " " + " ".join(f"{j}:{v:.25f}" for j, v in enumerate(vals))
    X4, _ = read_xc(_write(tmp_path, "2 700 1\n 0:1\n" + line + "\n", "wide.txt"),
                    use_kernel=True)
    np.testing.assert_array_equal(X4.toarray()[1], vals.astype(np.float32))
    # error line numbers stay right across chunks
    bad = lines[:25] + [" 1:0.5 2:x"] + lines[26:]
    with pytest.raises(DataFormatError) as ei:
        read_xc(_write(tmp_path, "40 30 1\n" + "\n".join(bad), "bad.txt"), use_kernel=True)
    assert ei.value.line == 27 and ei.value.token == "2:x"


def test_read_split(tmp_path):
    xp = _write(tmp_path, "3 5\n0:0.5 3:1.25\n\n4:2\n", "trn_X_Xf.txt")
    yp = _write(tmp_path, "3 4\n1:1 3:1\n2\n0:1.000000 0 2:0\n", "trn_X_Y.txt")
    X, Y = read_split(xp, yp)
    _assert_canonical(X)
    _assert_canonical(Y)
    np.testing.assert_array_equal(X.toarray(), [[0.5, 0, 0, 1.25, 0], [0] * 5, [0, 0, 0, 0, 2]])
    np.testing.assert_array_equal(Y.toarray(), [[0, 1, 0, 1], [0, 0, 1, 0], [1, 0, 1, 0]])
    with pytest.raises(DataFormatError) as ei:
        read_split(xp, _write(tmp_path, "3 4\n1\n4\n0\n", "bad_Y.txt"))
    assert "bad_Y.txt" in str(ei.value) and ei.value.line == 3 and ei.value.token == "4"
    with pytest.raises(DataFormatError) as ei:
        read_split(xp, _write(tmp_path, "2 4\n1\n0\n", "short_Y.txt"))
    assert "short_Y.txt" in str(ei.value)
    with pytest.raises(DataFormatError) as ei:
        read_split(_write(tmp_path, "3 5\n0:0.5\n7:1\n\n", "bad_Xf.txt"), yp)
    assert ei.value.line == 3 and ei.value.token == "7:1"


def test_read_libsvm(tmp_path):
    p = _write(tmp_path, "1,3 0:1 7:0.5\n\n 2:3\n0 \n")
    X, Y = read_libsvm(p)
    assert X.shape == (3, 8) and Y.shape == (3, 4)
    np.testing.assert_array_equal(Y.toarray(), [[0, 1, 0, 1], [0] * 4, [1, 0, 0, 0]])
    assert X[0, 7] == 0.5 and X[1, 2] == 3
    X, Y = read_libsvm(p, n_features=10, n_labels=6)
    assert X.shape == (3, 10) and Y.shape == (3, 6)
    with pytest.raises(DataFormatError) as ei:
        read_libsvm(p, n_features=5)
    assert ei.value.line == 1 and ei.value.token == "7:0.5"
    with pytest.raises(DataFormatError) as ei:
        read_libsvm(p, n_labels=3)
    assert ei.value.line == 1 and ei.value.token == "1,3"


def test_public_exports():
    assert slide.read_xc is read_xc and slide.DataFormatError is DataFormatError
    assert issubclass(DataFormatError, ValueError)


# ---------------------------------------------------------------------------------------------
# bad input: type, path, line and token


BAD = [
    # (file text, line, token, reason fragment)
    ("3 5 4\n0 1:0.5\n1 3:\n2 0:1\n", 3, "3:", "malformed"),
    ("2 5 4\n0 :4\n1 0:1\n", 2, ":4", "malformed"),
    ("2 5 4\n0 1:1\n1 a:b\n", 3, "a:b", "malformed"),
    ("2 5 4\n0 3:4:5\n1 0:1\n", 2, "3:4:5", "malformed"),
    ("2 5 4\n0 1:0.5 hello\n1 0:1\n", 2, "hello", "stray"),
    ("2 5 4\n 1:0.5 7\n1 0:1\n", 2, "7", "stray"),
    ("2 5 4\n0 1:abc\n1 0:1\n", 2, "1:abc", "non-numeric"),
    ("2 5 4\n0 1:0.5\n1 0:1..2\n", 3, "0:1..2", "non-numeric"),
    ("2 5 4\n0 1:nan\n1 0:1\n", 2, "1:nan", "non-finite"),
    ("2 5 4\n0 1:inf\n1 0:1\n", 2, "1:inf", "non-finite"),
    ("2 5 4\n0 1:0.5\n1 0:-Infinity\n", 3, "0:-Infinity", "non-finite"),
    ("2 5 4\n0 1:1e999\n1 0:1\n", 2, "1:1e999", "non-finite"),
    ("2 5 4\n0 1:1e39\n1 0:1\n", 2, "1:1e39", "float32"),
    ("2 5 4\n0 -1:0.5\n1 0:1\n", 2, "-1:0.5", "negative"),
    ("2 5 4\n0 1:0.5\n1 5:1\n", 3, "5:1", "num_features"),
    ("2 5 4\n0 1:0.5\n1 99999999999:1\n", 3, "99999999999:1", "num_features"),
    ("2 5 4\n4 1:0.5\n1 0:1\n", 2, "4", "num_labels"),
    ("2 5 4\n0,1,9 1:0.5\n1 0:1\n", 2, "0,1,9", "num_labels"),
    ("2 5 4\n1.5 1:0.5\n1 0:1\n", 2, "1.5", "non-negative integer"),
    ("2 5 4\n0,x 1:0.5\n1 0:1\n", 2, "0,x", "non-negative integer"),
    ("2 5 4\n-1 1:0.5\n1 0:1\n", 2, "-1", "negative label"),
    ("2 5 4\n0,,1 1:0.5\n1 0:1\n", 2, "0,,1", "malformed"),
    ("2 5 4\n0,1, 1:0.5\n1 0:1\n", 2, "0,1,", "malformed"),
    ("2 5 4\n0 1:0.5 1:0.7\n1 0:1\n", 2, "1:0.7", "duplicate"),
    ("2 5 4\n0 3:0.5 1:0.2 3:0.7\n1 0:1\n", 2, "3:0.7", "duplicate"),
    ("3 5\n0 1:1\n", 1, "3 5", "header"),
    ("3 5 x\n0 1:1\n", 1, "x", "header"),
    ("3 -5 4\n0 1:1\n", 1, "-5", "header"),
    ("3 5 4 1\n0 1:1\n", 1, "3 5 4 1", "header"),
    ("\n0 1:1\n", 1, "<blank line>", "header"),
    ("", 1, "<empty file>", "empty"),
    ("2 5 4\n0 1:1\n1 0:1\n2 2:1\n", 4, "2", "more lines"),
    ("2 5 4\n0 1:1\n1 0:1\n\n 3:0.5\n", 5, "3:0.5", "more lines"),
    ("3 5 4\n0 1:1\n1 0:1\n", 4, "<end of file>", "header declares 3"),
    ("3 5 4\n0 1:1\n1 0:1", 4, "<end of file>", "header declares 3"),
    ("3 5 4\n0 1:1\n1 0:1\n2 12:", 4, "12:", "malformed"),  # truncated mid-token
    ("3 5 4\n0 1:1\n1 0:1\n2 3:0.5e", 4, "3:0.5e", "non-numeric"),  # truncated mid-value
]


@pytest.mark.parametrize("text,line,token,reason", BAD)
def test_bad_input(read, tmp_path, text, line, token, reason):
    p = _write(tmp_path, text)
    with pytest.raises(DataFormatError) as ei:
        read(p)
    e = ei.value
    msg = str(e)
    assert isinstance(e, ValueError)
    assert str(p) in msg and e.path == str(p)
    assert f"line {line}" in msg and e.line == line
    assert repr(token) in msg and e.token == token
    assert reason in msg


def test_error_pickles(tmp_path):
    import pickle

    e = DataFormatError("f.txt", 3, "1:x", "non-numeric value 'x'")
    e2 = pickle.loads(pickle.dumps(e))
    assert (e2.path, e2.line, e2.token, str(e2)) == (e.path, e.line, e.token, str(e))


def test_zero_points(read, tmp_path):
    for text in ("0 5 3\n", "0 5 3", "0 5 3\n\n"):
        X, Y = read(_write(tmp_path, text))
        assert X.shape == (0, 5) and Y.shape == (0, 3) and X.nnz == 0


def test_missing_file(tmp_path):
    p = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        read_xc(p)
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        read_split(p, p)
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        read_libsvm(p)


# ---------------------------------------------------------------------------------------------
# validation of in-memory input


def test_as_feature_matrix():
    dense = np.array([[0, 1.5, 0], [2, 0, 0]], dtype=np.float64)
    for inp in (dense, sp.csr_matrix(dense), sp.coo_matrix(dense), sp.csc_array(dense)):
        M = as_feature_matrix(inp, n_features=3)
        _assert_canonical(M)
        np.testing.assert_array_equal(M.toarray(), dense)
    coo = sp.coo_matrix((np.array([1.0, 2.0, 3.0]), ([0, 0, 1], [2, 2, 0])), shape=(2, 3))
    M = as_feature_matrix(coo)
    assert M[0, 2] == 3.0 and M.nnz == 2  # duplicates summed
    unsorted = sp.csr_matrix((np.array([1.0, 2.0], np.float32), np.array([2, 0]),
                              np.array([0, 2])), shape=(1, 3))
    _assert_canonical(as_feature_matrix(unsorted))
    with pytest.raises(ValueError, match="Xtr.*2-D"):
        as_feature_matrix(np.ones(3), name="Xtr")
    with pytest.raises(ValueError, match="X.*non-finite"):
        as_feature_matrix(np.array([[np.nan, 1.0]]))
    with pytest.raises(ValueError, match="X.*non-finite"):
        as_feature_matrix(sp.csr_matrix(np.array([[0, np.inf]])))
    with pytest.raises(ValueError, match="float32 range"):
        as_feature_matrix(np.array([[1e300, 1.0]]))
    with pytest.raises(ValueError, match="Xv.*3 features.*expected 4"):
        as_feature_matrix(dense, n_features=4, name="Xv")
    with pytest.raises(ValueError, match="numeric"):
        as_feature_matrix(np.array([["a", "b"]]))


def test_canonical_csr_is_shared_and_the_callers_matrix_never_changes():
    """A canonical float32 CSR X is used as it is (no copy: 0.28 GiB of the fit's peak at
    Amazon-670K's shape); one whose ids are unsorted or repeated, or whose arrays are
    read-only, is copied before it is summed and sorted, and the caller's arrays keep their
    bytes."""
    rng = np.random.default_rng(0)
    canon = sp.random(40, 30, density=0.2, format="csr", dtype=np.float32, random_state=rng)
    canon.indptr = canon.indptr.astype(np.int32)
    canon.indices = canon.indices.astype(np.int32)
    M = as_feature_matrix(canon)
    assert np.shares_memory(M.data, canon.data) and np.shares_memory(M.indices, canon.indices)
    _assert_canonical(M)
    # unsorted ids with a duplicate (row 0: 2, 0, 2), and a read-only canonical copy
    messy = sp.csr_matrix((np.array([1.0, 2.0, 3.0, 4.0], np.float32),
                           np.array([2, 0, 2, 1], np.int32), np.array([0, 3, 4], np.int32)),
                          shape=(2, 3))
    frozen = canon.copy()
    for a in (frozen.data, frozen.indices, frozen.indptr):
        a.flags.writeable = False
    for X in (messy, frozen):
        before = [a.copy() for a in (X.data, X.indices, X.indptr)]
        M = as_feature_matrix(X)
        _assert_canonical(M)
        assert not np.shares_memory(M.data, X.data)
        for a, b in zip(before, (X.data, X.indices, X.indptr)):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(as_feature_matrix(messy).toarray(),
                                  [[2.0, 0.0, 4.0], [0.0, 4.0, 0.0]])
    # a whole fit on the messy matrix leaves it as it was
    X = sp.csr_matrix((np.tile(messy.data, 8), np.tile(messy.indices, 8),
                       np.arange(0, 33, 2, dtype=np.int32)), shape=(16, 3))
    before = [a.copy() for a in (X.data, X.indices, X.indptr)]
    slide.SlideClassifier(hidden_sizes=(8,), epochs=1, neighbours=0, rerank=False,
                          random_state=0).fit(X, [[i % 3] for i in range(16)])
    for a, b in zip(before, (X.data, X.indices, X.indptr)):
        np.testing.assert_array_equal(a, b)


def test_as_label_matrix():
    expect = np.array([[0, 1, 0, 1], [0, 0, 0, 0], [1, 0, 0, 0]], np.float32)
    for inp in ([[3, 1, 1], [], [0]], ([3, 1], (), np.array([0])), [[3.0, 1.0], [], [0]],
                expect.astype(int), sp.csr_matrix(expect), sp.coo_matrix(expect)):
        M = as_label_matrix(inp, n_labels=4, n_rows=3)
        _assert_canonical(M)
        np.testing.assert_array_equal(M.toarray(), expect)
    assert as_label_matrix([[5], []]).shape == (2, 6)
    with pytest.raises(ValueError, match=r"Ytr\[1\].*negative"):
        as_label_matrix([[0], [-1]], name="Ytr")
    with pytest.raises(ValueError, match=r"Y\[0\].*>= n_labels = 4"):
        as_label_matrix([[4]], n_labels=4)
    with pytest.raises(ValueError, match="non-integer"):
        as_label_matrix([[1.5]])
    with pytest.raises(ValueError, match="non-integer"):
        as_label_matrix([["a"]])
    with pytest.raises(ValueError, match="0/1"):
        as_label_matrix(np.array([[0, 2]]))
    with pytest.raises(ValueError, match="0/1"):
        as_label_matrix(sp.csr_matrix(np.array([[0.5, 1]])))
    with pytest.raises(ValueError, match="0/1"):
        as_label_matrix(np.array([[np.nan, 1]]))
    with pytest.raises(ValueError, match="3 rows, expected 2"):
        as_label_matrix(expect, n_rows=2)
    with pytest.raises(ValueError, match="4 label columns, expected n_labels = 5"):
        as_label_matrix(expect, n_labels=5)
    with pytest.raises(ValueError, match="2-D"):
        as_label_matrix(np.array([0, 1]))


def _csr_unchecked(data, indices, indptr, shape, cls=sp.csr_matrix):
    """A compressed matrix as scipy builds it from raw arrays: without checking the ids."""
    return cls((np.asarray(data, np.float32), np.asarray(indices), np.asarray(indptr)),
               shape=shape)


@pytest.mark.parametrize("cls", [sp.csr_matrix, sp.csr_array])
def test_sparse_ids_are_bounds_checked_before_conversion(cls):
    """scipy accepts ids outside the shape; the kernels would read or write out of bounds
    (issue 28: a segfault, heap corruption, or silently wrong predictions)."""
    ptr = [0, 1, 2, 3, 5]
    ok = [0, 1, 2, 3, 4]
    for bad_id in (35, 30, 1_000_000, -1):
        ind = list(ok)
        ind[3] = bad_id
        X = _csr_unchecked(np.ones(5), ind, ptr, (4, 30), cls)
        with pytest.raises(ValueError, match=f"X row 3 has feature id {bad_id}, but X has 30 "
                                             "columns"):
            as_feature_matrix(X)
        Y = _csr_unchecked(np.ones(5), [i % 30 if i != bad_id else bad_id for i in ind], ptr,
                           (4, 30), cls)
        with pytest.raises(ValueError, match=f"Y row 3 has label id {bad_id}, but Y has 30 "
                                             "columns"):
            as_label_matrix(Y)
    # CSC: the ids are row ids
    Xc = _csr_unchecked(np.ones(2), [0, 7], [0, 1, 2], (4, 2), sp.csc_matrix)
    with pytest.raises(ValueError, match="X \\(CSC\\) column 1 has row id 7, but X has 4 rows"):
        as_feature_matrix(Xc)
    # COO: both coordinates
    coo = sp.coo_matrix((np.ones(2), (np.array([0, 1]), np.array([2, 0]))), shape=(2, 3))
    coo.col[0] = 3
    with pytest.raises(ValueError, match="X row 0 has feature id 3, but X has 3 columns"):
        as_feature_matrix(coo)
    coo.col[0] = 2
    coo.row[1] = -2
    with pytest.raises(ValueError, match="Y entry 1 has row id -2, but Y has 2 rows"):
        as_label_matrix(coo)
    # malformed pointers
    X = _csr_unchecked(np.ones(5), ok, ptr, (4, 30))
    X.indptr = np.array([0, 2, 1, 3, 5])
    with pytest.raises(ValueError, match="X's CSR indptr decreases at row 1"):
        as_feature_matrix(X)
    X.indptr = np.array([1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="indptr starts at 1"):
        as_feature_matrix(X)
    X.indptr = np.array([0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match="indptr ends at 4, but there are 5 stored entries"):
        as_feature_matrix(X)
    X.indptr = np.array([0, 1, 5])
    with pytest.raises(ValueError, match="indptr has 3 entries, expected 5"):
        as_feature_matrix(X)
    X.indptr = np.array(ptr)
    X.data = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="5 indices, 4 values"):
        as_feature_matrix(X)
    # in range: unsorted and duplicate ids are summed and sorted, as before
    X = _csr_unchecked([1, 2, 3], [29, 0, 29], [0, 3], (1, 30), cls)
    M = as_feature_matrix(X)
    _assert_canonical(M)
    assert M.indices.tolist() == [0, 29] and M.data.tolist() == [2.0, 4.0]


def test_a_stray_label_id_in_label_lists_warns():
    """A mistyped id (here 90000 among ids below 50) silently widened the output layer."""
    lists = [[i % 50, (i * 7) % 50] for i in range(100)] + [[90000]]
    with pytest.warns(UserWarning, match="label id 90000 is more than 10 times the next "
                                         "largest \\(49\\)"):
        M = as_label_matrix(lists)
    assert M.shape == (101, 90001)
    with pytest.raises(ValueError, match=r"Y\[100\] contains label 90000 >= n_labels = 50"):
        as_label_matrix(lists, n_labels=50)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        as_label_matrix(lists[:-1])                      # dense ids
        as_label_matrix([[0], [5]])                      # small ids
        as_label_matrix([[3], [90000]] + [[i * 3000] for i in range(30)])  # spread out
        as_label_matrix(lists, n_labels=90001)           # the count is given


def test_write_xc_validates(tmp_path):
    with pytest.raises(ValueError, match="Y has 1 rows, expected 2"):
        write_xc(tmp_path / "x.txt", np.ones((2, 2)), [[0]])
    with pytest.raises(ValueError, match="non-finite"):
        write_xc(tmp_path / "x.txt", np.array([[np.nan]]), [[0]])


# ---------------------------------------------------------------------------------------------
# batching


def test_iterate_minibatches():
    batches = list(iterate_minibatches(103, 10, seed=7))
    assert [len(b) for b in batches] == [10] * 10 + [3]
    assert all(b.dtype == np.int64 for b in batches)
    allrows = np.concatenate(batches)
    np.testing.assert_array_equal(np.sort(allrows), np.arange(103))
    assert not np.array_equal(allrows, np.arange(103))  # not file order
    again = np.concatenate(list(iterate_minibatches(103, 10, seed=7)))
    np.testing.assert_array_equal(allrows, again)
    other_epoch = np.concatenate(list(iterate_minibatches(103, 10, seed=7, epoch=1)))
    assert not np.array_equal(allrows, other_epoch)
    other_seed = np.concatenate(list(iterate_minibatches(103, 10, seed=8)))
    assert not np.array_equal(allrows, other_seed)
    resumed = list(iterate_minibatches(103, 10, seed=7, start_batch=4))
    assert len(resumed) == 7
    np.testing.assert_array_equal(np.concatenate(resumed), allrows[40:])
    assert list(iterate_minibatches(103, 10, seed=7, start_batch=11)) == []
    assert list(iterate_minibatches(0, 10, seed=7)) == []
    for bad in (dict(batch_size=0), dict(seed=-1), dict(start_batch=-1), dict(batch_size=2.5)):
        kw = dict(n_rows=10, batch_size=3, seed=0)
        kw.update(bad)
        with pytest.raises(ValueError):
            list(iterate_minibatches(**kw))


def test_take_rows_is_row_indexing_without_casting_the_whole_matrix():
    from slide.data.inputs import slice_rows, take_rows
    dense = sp.random(50, 30, density=0.2, random_state=3, dtype=np.float32).toarray()
    dense[7] = 0                                    # an empty row
    A = sp.csr_matrix(dense)
    A.indptr = A.indptr.astype(np.int64)            # int64 indptr beside int32 ids
    rows = np.array([7, 3, 49, 3, 0])
    got = take_rows(A, rows)
    assert got.shape == (5, 30) and got.dtype == np.float32
    np.testing.assert_array_equal(got.toarray(), A.toarray()[rows])
    assert take_rows(A, np.zeros(0, np.int64)).shape == (0, 30)
    for lo, hi in ((0, 50), (5, 9), (7, 8), (20, 20)):
        np.testing.assert_array_equal(slice_rows(A, lo, hi).toarray(), A.toarray()[lo:hi])


def test_cap_row_labels_cuts_only_long_rows_to_a_seeded_subset():
    rng = np.random.default_rng(0)
    lengths = [0, 1, 3, 4, 9, 30, 4]
    rows = [np.sort(rng.choice(50, n, replace=False)) for n in lengths]
    Y = sp.csr_matrix((np.ones(sum(lengths), np.float32),
                       (np.repeat(np.arange(len(lengths)), lengths), np.concatenate(rows))),
                      shape=(len(lengths), 50))
    assert D.cap_row_labels(Y, 0, 1) is Y               # no cap
    assert D.cap_row_labels(Y, 30, 1) is Y              # no row exceeds it
    a, b, other = (D.cap_row_labels(Y, 4, 1), D.cap_row_labels(Y, 4, 1),
                   D.cap_row_labels(Y, 4, 2))
    np.testing.assert_array_equal(np.diff(a.indptr), np.minimum(lengths, 4))
    for r, full in enumerate(rows):
        got = a.indices[a.indptr[r]:a.indptr[r + 1]]
        assert np.all(np.diff(got) > 0) and np.isin(got, full).all()
        if lengths[r] <= 4:
            np.testing.assert_array_equal(got, full)
    assert (a != b).nnz == 0                            # deterministic for the seed
    assert (a != other).nnz > 0                         # another subset for another seed
    assert Y.getnnz() == sum(lengths)                   # the input is left alone
