"""Tests of slide.data.xc_numpy: the XC reader that needs no compiled kernel, what it takes,
what it hands to the parser kernel, and when ``read_xc`` uses it."""
import os
import subprocess
import sys

import numpy as np
import pytest

from slide.data import DataFormatError, read_xc, xc, xc_numpy
from slide.data.xc_numpy import parse_xc_body

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_possessive = pytest.mark.skipif(
    xc_numpy._BODY is None, reason="Python 3.10's re has no possessive repeats: the parser "
    "kernel reads every file there")


def _random_text(rng, n_rows, n_features, n_labels):
    """XC text in the reader's subset, with everything the subset allows: unsorted features,
    repeated and unsorted labels, lines without labels, without features or empty, values in
    every spelling (signs, exponents, leading zeros, long expansions, explicit zeros)."""
    spell = [lambda v: f"{v:.5f}", lambda v: f"{v:.25f}", lambda v: f"{v:e}",
             lambda v: f"{v:+.3E}", lambda v: repr(float(v)), lambda v: f"{v:.0f}.",
             lambda v: f"00{abs(v):.4f}", lambda v: "0", lambda v: "-0.0",
             lambda v: f"{v:.3f}".replace("0.", ".", 1) if 0 < v < 1 else f"{v:.2f}"]
    lines = []
    for _ in range(n_rows):
        labels = rng.integers(0, n_labels, rng.integers(0, 6))
        ids = rng.choice(n_features, rng.integers(0, min(n_features, 30)), replace=False)
        values = rng.standard_normal(ids.shape[0]) * 10.0 ** rng.integers(-8, 8, ids.shape[0])
        feats = "".join(f" {i:0{rng.integers(1, 4)}d}:{spell[rng.integers(len(spell))](v)}"
                        for i, v in zip(ids, values))
        lines.append(",".join(map(str, labels)) + feats)
    return f"{n_rows} {n_features} {n_labels}\n" + "\n".join(lines)


def _same(A, B):
    assert A.shape == B.shape
    for a, b in ((A.indptr, B.indptr), (A.indices, B.indices)):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert A.data.dtype == B.data.dtype
    np.testing.assert_array_equal(A.data.view(np.uint32), B.data.view(np.uint32))
    assert A.has_sorted_indices and B.has_sorted_indices


@needs_possessive
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("final_newline", [True, False])
def test_what_it_takes_it_reads_as_the_kernel_does(tmp_path, seed, final_newline):
    rng = np.random.default_rng(seed)
    text = _random_text(rng, 200, 50, 12) + ("\n" if final_newline else "")
    path = tmp_path / "d.txt"
    path.write_text(text)
    body = text.encode().split(b"\n", 1)[1]
    assert parse_xc_body(body, 200, 50, 12) is not None     # it took the file
    X, Y = read_xc(path, use_kernel=False)
    Xk, Yk = read_xc(path, use_kernel=True)
    _same(X, Xk)
    _same(Y, Yk)


@pytest.mark.parametrize("body", [
    b"0 1:1 \n1 0:1\n",            # a trailing space
    b"0 1:1\r\n1 0:1\r\n",         # carriage returns
    b"0  1:1\n1 0:1\n",            # two spaces
    b"0\t1:1\n1 0:1\n",            # a tab
    b"0 1:1\n1 0:1\n\n",           # a blank line past the points
    b"0 1:1\n",                    # fewer lines than points
    b"0 1:1 1:2\n1 0:1\n",         # a repeated feature
    b"0 5:1\n1 0:1\n",             # a feature out of range
    b"4 1:1\n1 0:1\n",             # a label out of range
    b"0 1:1e39\n1 0:1\n",          # a value outside float32
    b"0 1:1e999\n1 0:1\n",         # a value outside float64
    b"0 1:nan\n1 0:1\n",
    b"0 1:1e\n1 0:1\n",
    b"0 1:1..2\n1 0:1\n",
    b"0,,1 1:1\n1 0:1\n",
    b"0, 1:1\n1 0:1\n",
    b"0 1:1 7\n1 0:1\n",           # a feature without a value
    b"0 1:1,2\n1 0:1\n",           # a comma among the features
    b"0 1:2:3\n1 0:1\n",
    b"-1 1:1\n1 0:1\n",
    b"0 -1:1\n1 0:1\n",
    b"1:1\n1 0:1\n",               # a feature where the labels go
])
def test_what_it_does_not_take_goes_to_the_kernel(tmp_path, body):
    """Outside its subset it returns None, and ``read_xc`` then reads the file with the kernel:
    the same matrices or the same error, line and token."""
    assert parse_xc_body(body, 2, 5, 4) is None
    path = tmp_path / "d.txt"
    path.write_bytes(b"2 5 4\n" + body)
    try:
        want = read_xc(path, use_kernel=True)
    except DataFormatError as e:
        with pytest.raises(DataFormatError) as got:
            read_xc(path, use_kernel=False)
        assert (got.value.line, got.value.token, str(got.value)) == (e.line, e.token, str(e))
    else:
        got = read_xc(path, use_kernel=False)
        _same(got[0], want[0])
        _same(got[1], want[1])


@needs_possessive
def test_by_default_numpy_reads_only_small_files_while_the_kernel_is_not_compiled(
        tmp_path, monkeypatch):
    path = tmp_path / "d.txt"
    path.write_text("2 5 4\n0,1 1:1\n 0:2\n")
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:          # a sparse file: its size without its bytes
        f.truncate(xc.NUMPY_READ_MAX_BYTES + 1)
    calls = []
    monkeypatch.setattr(xc, "parse_xc_body", lambda *a: calls.append(a) or parse_xc_body(*a))
    monkeypatch.setattr(xc, "is_compiled", lambda dispatcher: True)
    read_xc(path)
    assert not calls
    monkeypatch.setattr(xc, "is_compiled", lambda dispatcher: False)
    X, Y = read_xc(path)
    assert len(calls) == 1 and X.nnz == 2 and Y.nnz == 2
    with pytest.raises(DataFormatError):    # the big file went to the kernel: no header
        read_xc(big)
    assert len(calls) == 1


@needs_possessive
def test_a_first_read_in_a_cold_cache_compiles_nothing(tmp_path):
    """A new user's first ``read_xc`` (an empty Numba cache) compiles no kernel; the parser
    compiles only once a file needs it."""
    path = tmp_path / "d.txt"
    path.write_text(_random_text(np.random.default_rng(0), 50, 20, 5) + "\n")
    bad = tmp_path / "bad.txt"
    bad.write_text("1 5 4\n0 1:x\n")
    code = ("import sys, slide\n"
            "from slide.data import DataFormatError\n"
            "from slide.kernels.parse import _parse_chunk\n"
            "X, Y = slide.read_xc(sys.argv[1])\n"
            "print(X.nnz, Y.nnz, len(_parse_chunk.signatures))\n"
            "try:\n"
            "    slide.read_xc(sys.argv[2])\n"
            "except DataFormatError as e:\n"
            "    print(e.line, e.token, len(_parse_chunk.signatures))\n")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")]
                                                    if p]))
    out = subprocess.run([sys.executable, "-c", code, str(path), str(bad)], env=env,
                         capture_output=True, text=True, check=True).stdout.split("\n")
    X, Y = read_xc(path, use_kernel=True)
    assert out[0] == f"{X.nnz} {Y.nnz} 0"
    assert out[1] == "2 1:x 1"


def test_what_is_compiled_is_known_or_assumed():
    """``is_compiled``: a kernel called in this process is; a plain function (what the kernels
    are under ``NUMBA_DISABLE_JIT``) counts as compiled, so ``read_xc`` keeps its usual
    path."""
    import io

    from slide.kernels.cache import is_compiled
    from slide.kernels.parse import _count_bytes
    xc._count_file(io.BytesIO(b"1 3 2\n1 0:1\n"), 0)      # calls _count_bytes
    assert is_compiled(_count_bytes)
    assert is_compiled(lambda: None)
