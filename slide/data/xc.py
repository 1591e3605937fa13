"""Data I/O for extreme-classification (XC) data sets.

Formats
-------
* **XC repository format** (``read_xc`` / ``write_xc``): a header line
  ``num_points num_features num_labels`` followed by one line per point::

      l1,l2,...,lk f1:v1 f2:v2 ...

  with zero-based indices. A point without labels is a line that starts with a space; a point
  without features simply has no ``f:v`` tokens; an empty line is a point with neither.
  Lines beyond the header's count must be blank.
* **Split format** (``read_split``): ``trn_X_Xf.txt`` (header ``rows cols``, lines of ``idx:val``)
  and ``trn_X_Y.txt`` (header ``rows cols``, lines of ``idx:val`` or ``idx``; every listed label
  counts as 1, whatever its value).
* **Multilabel libsvm** (``read_libsvm``): XC lines without a header; blank lines are skipped.

Parsing is done by a Numba byte parser over fixed-size chunks of the file, so peak memory is the
output CSR plus one chunk (no per-token Python loop). Until that parser is compiled, ``read_xc``
reads a file of up to ``NUMPY_READ_MAX_BYTES`` with NumPy instead (``slide.data.xc_numpy``: a
new user's first read waits for no compiler), handing the parser whatever text that reader does
not take. A value is read as ``float32(float64(text))``
-- the same semantics as NumPy and scikit-learn -- with an exact fast path (Clinger) in the kernel
and Python's ``float`` for the rare token outside it. Any problem raises :class:`DataFormatError`
naming the file, the 1-based line number (the header is line 1) and the offending token; the
kernel only reports where it stopped, the message is built in Python.

Row order
---------
Files of the Extreme Classification Repository are sorted by label, so training and evaluation
must never consume them in file order: use :func:`iterate_minibatches`, which yields a
permutation derived from ``(seed, epoch)``.
"""
import os

import numpy as np
import scipy.sparse as sp

from slide.data.inputs import _INT32_MAX, as_feature_matrix, as_label_matrix
from slide.data.xc_numpy import parse_xc_body
from slide.fileio import atomic_write
from slide.kernels.cache import is_compiled
from slide.kernels.jit import njit
from slide.kernels.parse import (_E_DUPLICATE, _E_EXTRA_LINE, _E_INDEX_RANGE, _E_LABEL,
                                 _E_LABEL_RANGE, _E_MALFORMED, _E_NEG_INDEX, _E_NEG_LABEL,
                                 _E_NONNUMERIC, _MODE_FEATURES, _MODE_LABELS, _MODE_XC, _POW10,
                                 _S_DONE, _S_ERROR, _ST_LINES, _ST_NHARD, _ST_NNZX, _ST_NNZY,
                                 _ST_ROW, _count_bytes, _last_newline, _parse_chunk,
                                 exact_decimal)


_CHUNK = 1 << 25  # 32 MiB of text per parser call
_HARD_CAP = 4096  # values the kernel hands to Python's float() per call


class DataFormatError(ValueError):
    """Malformed data file. ``path``, ``line`` (1-based, header is line 1) and ``token``."""

    def __init__(self, path, line, token, reason):
        self.path = str(path)
        self.line = int(line)
        self.token = str(token)
        self.reason = str(reason)
        super().__init__(f"{self.path}, line {self.line}: {self.reason} (token {self.token!r})")

    def __reduce__(self):
        return (type(self), (self.path, self.line, self.token, self.reason))


# ---------------------------------------------------------------------------------------------
# reading


def _decode(b):
    return bytes(b).decode("utf-8", errors="replace")


def _read_header(path, f, n_fields, names):
    raw = f.readline()
    if raw == b"" or not raw.strip():
        if raw == b"":
            raise DataFormatError(path, 1, "<empty file>", "empty file, expected a header line "
                                  f"'{' '.join(names)}'")
        raise DataFormatError(path, 1, _decode(raw).strip() or "<blank line>",
                              f"blank header line, expected '{' '.join(names)}'")
    text = _decode(raw).strip()
    fields = text.split()
    if len(fields) != n_fields:
        raise DataFormatError(path, 1, text, f"header must be {n_fields} non-negative integers "
                              f"'{' '.join(names)}', got {len(fields)} fields")
    values = []
    for name, fld in zip(names, fields):
        if not fld.isdigit() or not fld.isascii():
            raise DataFormatError(path, 1, fld, f"header field {name} must be a non-negative "
                                  "integer")
        v = int(fld)
        if v > _INT32_MAX:
            raise DataFormatError(path, 1, fld, f"header field {name} is too large "
                                  f"(> {_INT32_MAX})")
        values.append(v)
    return values, len(raw)


def _count_file(f, offset):
    """Counts (newlines, colons, commas, token starts), whether the file ends without newline."""
    counts = np.zeros(4, dtype=np.int64)
    buf = np.empty(_CHUNK, dtype=np.uint8)
    f.seek(offset)
    prev = 10
    total = 0
    while True:
        n = f.readinto(buf)
        if not n:
            break
        total += n
        prev = _count_bytes(buf, n, counts, prev)
    return counts, total > 0 and prev != 10


_REASONS = {
    _E_MALFORMED: "malformed token",
    _E_NONNUMERIC: "non-numeric value",
    _E_NEG_INDEX: "negative feature index",
    _E_INDEX_RANGE: "feature index out of range",
    _E_LABEL: "label is not a non-negative integer",
    _E_NEG_LABEL: "negative label",
    _E_LABEL_RANGE: "label out of range",
    _E_DUPLICATE: "duplicate feature index",
    _E_EXTRA_LINE: "more lines than the header declares",
}


def _raise_kernel_error(path, buf, err, header_lines, ctx):
    code = int(err[0])
    line = header_lines + int(err[1]) + 1
    token = _decode(buf[int(err[2]):int(err[3])])
    reason = _REASONS.get(code, "malformed input")
    if code == _E_NONNUMERIC:
        value = token.split(":", 1)[1] if ":" in token else token
        try:
            fv = float(value)
        except ValueError:
            fv = None
        if fv is not None and not np.isfinite(fv):
            reason = f"non-finite value {value!r}"
        else:
            reason = f"non-numeric value {value!r}"
    elif code == _E_INDEX_RANGE:
        reason = f"feature index >= num_features = {ctx['n_features']}"
    elif code == _E_LABEL_RANGE:
        reason = f"label >= num_labels = {ctx['n_labels']}"
    elif code == _E_MALFORMED:
        if ":" not in token:
            reason = "malformed token (stray text, expected 'index:value')"
        else:
            reason = "malformed token, expected 'index:value'"
    elif code == _E_DUPLICATE:
        dup = int(err[4])
        text = _decode(buf[int(err[2]):int(err[3])])
        seen = False
        for tok in text.split():
            head = tok.split(":", 1)[0]
            if ":" in tok and head.isdigit() and int(head) == dup:
                if seen:
                    token = tok
                    break
                seen = True
        reason = f"duplicate feature index {dup} in one line"
    elif code == _E_EXTRA_LINE:
        reason = f"more lines than the header's {ctx['n_rows']} points"
    raise DataFormatError(path, line, token, reason)


def _parse_file(path, mode, has_header, n_rows, n_cols_x, n_cols_y, skip_blank):
    """Shared driver. n_rows/n_cols None: unknown (libsvm). Returns CSR pieces."""
    header_lines = 1 if has_header else 0
    with open(path, "rb") as f:
        if has_header:
            if mode == _MODE_XC:
                (n_rows, n_cols_x, n_cols_y), offset = _read_header(
                    path, f, 3, ("num_points", "num_features", "num_labels"))
            else:
                names = ("rows", "cols")
                (n_rows, ncols), offset = _read_header(path, f, 2, names)
                if mode == _MODE_FEATURES:
                    n_cols_x, n_cols_y = ncols, 0
                else:
                    n_cols_x, n_cols_y = 0, ncols
        else:
            offset = 0
        counts, no_final_nl = _count_file(f, offset)
        n_lines = int(counts[0]) + int(no_final_nl)
        if n_rows is None:
            n_rows = n_lines
        max_rows = n_rows
        cap_x = int(counts[1]) if mode != _MODE_LABELS else 0
        if mode == _MODE_XC:
            cap_y = int(counts[2]) + n_lines
        elif mode == _MODE_LABELS:
            cap_y = int(counts[3])
        else:
            cap_y = 0
        bx = _INT32_MAX if n_cols_x is None else n_cols_x
        by = _INT32_MAX if n_cols_y is None else n_cols_y
        x_ind = np.empty(cap_x, dtype=np.int32)
        x_dat = np.empty(cap_x, dtype=np.float32)
        y_ind = np.empty(cap_y, dtype=np.int32)
        x_ptr = np.zeros(min(max_rows, n_lines) + 1, dtype=np.int64)
        y_ptr = np.zeros(min(max_rows, n_lines) + 1, dtype=np.int64)
        state = np.zeros(6, dtype=np.int64)
        ctx = {"n_features": n_cols_x, "n_labels": n_cols_y, "n_rows": n_rows}
        _parse_chunks(path, f, offset, mode, skip_blank, max_rows, bx, by,
                      (x_ind, x_dat, y_ind, x_ptr, y_ptr), state, header_lines, ctx)
    rows = int(state[_ST_ROW])
    if has_header and rows < n_rows:
        raise DataFormatError(path, header_lines + int(state[_ST_LINES]) + 1, "<end of file>",
                              f"the header declares {n_rows} points but the file ends after "
                              f"{rows}")
    nx = int(state[_ST_NNZX])
    ny = int(state[_ST_NNZY])
    if nx < cap_x:
        x_ind = x_ind[:nx].copy()
        x_dat = x_dat[:nx].copy()
    if ny < cap_y:
        y_ind = y_ind[:ny].copy()
    x_ptr = x_ptr[: rows + 1]
    y_ptr = y_ptr[: rows + 1]
    if n_cols_x is None:
        n_cols_x = int(x_ind.max()) + 1 if nx else 0
    if n_cols_y is None:
        n_cols_y = int(y_ind.max()) + 1 if ny else 0
    X = _csr(x_dat, x_ind, x_ptr, (rows, n_cols_x)) if mode != _MODE_LABELS else None
    Y = (_csr(np.ones(ny, dtype=np.float32), y_ind, y_ptr, (rows, n_cols_y))
         if mode != _MODE_FEATURES else None)
    return X, Y


def _parse_chunks(path, f, offset, mode, skip_blank, max_rows, bx, by, csr, state, header_lines,
                  ctx):
    """Read f from `offset` in chunks of whole lines and parse them into csr/state in place.

    bx, by: the kernel's feature and label bounds; csr = (x_ind, x_dat, y_ind, x_ptr, y_ptr),
    preallocated by the caller. Raises DataFormatError at the first bad line."""
    hard = np.zeros((_HARD_CAP, 6), dtype=np.int64)
    err = np.zeros(5, dtype=np.int64)
    f.seek(offset)
    buf = np.empty(_CHUNK, dtype=np.uint8)
    filled = 0
    eof = False
    while not eof:
        n = f.readinto(memoryview(buf)[filled:])
        total = filled + (n or 0)
        if not n:
            eof = True
            end = total
        else:
            last = _last_newline(buf, total)
            if last < 0:
                if total == buf.shape[0]:  # a line longer than the buffer: grow it
                    nb = np.empty(2 * buf.shape[0], dtype=np.uint8)
                    nb[:total] = buf[:total]
                    buf = nb
                filled = total
                continue
            end = last + 1
        pos = 0
        while True:
            prev = pos
            status, pos = _parse_chunk(buf, pos, end, mode, skip_blank, max_rows, bx, by,
                                       csr, state, hard, err, _POW10)
            if state[_ST_NHARD]:
                _fix_hard(path, buf, hard, int(state[_ST_NHARD]), csr[1], header_lines)
                state[_ST_NHARD] = 0
            if status == _S_ERROR:
                _raise_kernel_error(path, buf, err, header_lines, ctx)
            if status == _S_DONE:
                break
            if pos == prev:  # one line holds more slow-path values than `hard` has room for
                hard = np.zeros((2 * hard.shape[0], 6), dtype=np.int64)
        rem = total - end
        if rem:
            buf[:rem] = buf[end:total].copy()
        filled = rem


def _fix_hard(path, buf, hard, n_hard, x_dat, header_lines):
    for h in range(n_hard):
        xpos, vs, ve, ts, te, line_id = (int(v) for v in hard[h])
        text = _decode(buf[vs:ve])
        v = float(text)
        with np.errstate(over="ignore"):
            v32 = np.float32(v)
        if not np.isfinite(v32):
            what = "non-finite value" if not np.isfinite(v) else "value outside the float32 range"
            raise DataFormatError(path, header_lines + line_id + 1, _decode(buf[ts:te]),
                                  f"{what} {text!r}")
        x_dat[xpos] = v32


def _csr(data, indices, indptr, shape):
    if indptr.shape[0] and indptr[-1] <= _INT32_MAX:
        indptr = indptr.astype(np.int32)
    m = sp.csr_matrix((data, indices, indptr), shape=tuple(int(s) for s in shape), copy=False)
    m.has_sorted_indices = True
    return m


def _check_path(path):
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such file: {path!r}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"is a directory, not a data file: {path!r}")
    return path


def read_xc(path, use_kernel=None):
    """Read an Extreme Classification Repository file.

    Returns ``(X, Y)``: ``X`` a CSR matrix (float32 values, int32 sorted indices, no duplicates;
    explicit zeros in the file are kept) of shape ``(num_points, num_features)``; ``Y`` a CSR
    matrix of float32 ones with int32 sorted indices of shape ``(num_points, num_labels)``
    (repeated labels on a line count once). Raises :class:`DataFormatError` for bad input.
    Remember that repository files are sorted by label: never train in file order.

    ``use_kernel``: parse with the compiled byte parser (True) or first try NumPy alone
    (False); by default the parser where it is compiled, and NumPy for a file of up to
    ``NUMPY_READ_MAX_BYTES`` while it is not (``slide.data.xc_numpy``). Both give the same
    matrices, and every error comes from the parser.
    """
    path = _check_path(path)
    if use_kernel is None:
        use_kernel = (is_compiled(_parse_chunk)
                      or os.path.getsize(path) > NUMPY_READ_MAX_BYTES)
    if not use_kernel:
        read = _read_xc_numpy(path)
        if read is not None:
            return read
    return _parse_file(path, _MODE_XC, True, None, None, None, False)


# Above this size a file waits for the parser to compile. NumPy reads about 40 MB/s, the
# parser compiles in ~4 s (3x that on a Zen 3 host) and then reads ~110 MB/s, so NumPy is
# the quicker first read up to ~250 MB; the bound keeps what it holds beside the result
# (about 5x the file's size, the parser's 3x) to a few hundred MB
# (bench/results/reading_23d14ab_intel.md; docs/design.md "Reading a file before anything is
# compiled").
NUMPY_READ_MAX_BYTES = 64 << 20


def _read_xc_numpy(path):
    """``(X, Y)`` of the XC file ``path`` read by ``slide.data.xc_numpy``, or None where its
    text is outside that reader's subset. The header's errors are raised here."""
    with open(path, "rb") as f:
        (n_rows, n_features, n_labels), _ = _read_header(
            path, f, 3, ("num_points", "num_features", "num_labels"))
        body = f.read()
    a = parse_xc_body(body, n_rows, n_features, n_labels)
    if a is None:
        return None
    X = _csr(a.x_data, a.x_indices, a.x_indptr, (n_rows, n_features))
    Y = _csr(np.ones(a.y_indices.shape[0], dtype=np.float32), a.y_indices, a.y_indptr,
             (n_rows, n_labels))
    return X, Y


def read_split(x_path, y_path):
    """Read the split format: ``X_Xf.txt`` (features) and ``X_Y.txt`` (labels); returns (X, Y)."""
    x_path = _check_path(x_path)
    y_path = _check_path(y_path)
    X, _ = _parse_file(x_path, _MODE_FEATURES, True, None, None, None, False)
    _, Y = _parse_file(y_path, _MODE_LABELS, True, None, None, None, False)
    if X.shape[0] != Y.shape[0]:
        raise DataFormatError(y_path, 1, str(Y.shape[0]),
                              f"label file has {Y.shape[0]} rows but feature file {x_path} "
                              f"has {X.shape[0]}")
    return X, Y


def read_libsvm(path, n_features=None, n_labels=None):
    """Read multilabel libsvm text (XC lines without a header; blank lines are skipped).

    ``n_features``/``n_labels`` default to the largest index + 1; when given, larger indices are
    errors.
    """
    path = _check_path(path)
    for name, v in (("n_features", n_features), ("n_labels", n_labels)):
        if v is not None and (not isinstance(v, (int, np.integer)) or v < 0):
            raise ValueError(f"{name} must be a non-negative integer or None, got {v!r}")
    return _parse_file(path, _MODE_XC, False, None,
                       None if n_features is None else int(n_features),
                       None if n_labels is None else int(n_labels), True)


# ---------------------------------------------------------------------------------------------
# writing


@njit(cache=True, nogil=True)
def _write_uint(out, pos, v):
    if v == 0:
        out[pos] = 48
        return pos + 1
    n = 0
    t = v
    while t > 0:
        n += 1
        t //= 10
    for k in range(n - 1, -1, -1):
        out[pos + k] = 48 + v % 10
        v //= 10
    return pos + n


@njit(cache=True, nogil=True)
def _digits(a, p, e):
    """Round a > 0 to p significant digits: (integer m with p digits, decimal exponent e)."""
    m = np.int64(0)
    for _ in range(4):
        k = p - 1 - e
        if k >= 0:
            s = a * 10.0**k if k > 22 else a * _POW10[k]
        else:
            s = a / 10.0**(-k) if -k > 22 else a / _POW10[-k]
        m = np.int64(np.rint(s))
        if m >= np.int64(10) ** p:
            e += 1
        elif m < np.int64(10) ** (p - 1):
            e -= 1
        else:
            return m, e
    return m, e


@njit(cache=True, nogil=True, inline="always")
def _shortest_digits(a, pow10):
    """(m, e): the fewest significant digits m (6 to 9 of them) of the positive float64 ``a``
    that read back (float32(float64(text))) as float32(a), and the decimal exponent e of the
    first one."""
    e0 = int(np.floor(np.log10(a)))
    m = np.int64(0)
    e = e0
    for p in range(6, 10):
        m, e = _digits(a, p, e0)
        if p == 9:
            break
        # does m * 10**(e - p + 1) read back (float32(float64(text))) as the same float32?
        exact, back = exact_decimal(m, e - p + 1, pow10)
        if not exact:
            continue
        if np.float32(back) == np.float32(a):
            break
    return m, e


@njit(cache=True, nogil=True, inline="always")
def _digit_bytes(m):
    """The decimal digits of m > 0 without its trailing zeros, as ASCII bytes."""
    nd = 0
    t = m
    while t > 0:
        nd += 1
        t //= 10
    while m % 10 == 0 and nd > 1:
        m //= 10
        nd -= 1
    digs = np.empty(nd, dtype=np.uint8)
    t = m
    for k in range(nd - 1, -1, -1):
        digs[k] = 48 + t % 10
        t //= 10
    return digs


@njit(cache=True, nogil=True)
def _write_float(out, pos, v32, pow10):
    """Write the float32 ``v32`` at out[pos:] in the shortest decimal text that reads back as
    it (positional for exponents -5..8, else d.ddde+x); returns the position after it."""
    v = np.float64(v32)
    if v == 0.0:
        if np.signbit(v):
            out[pos] = 45
            pos += 1
        out[pos] = 48
        return pos + 1
    if v < 0:
        out[pos] = 45
        pos += 1
        a = -v
    else:
        a = v
    m, e = _shortest_digits(a, pow10)
    digs = _digit_bytes(m)
    nd = digs.shape[0]
    if -5 <= e < 9:
        if e >= 0:
            for k in range(max(nd, e + 1)):
                if k == e + 1:
                    out[pos] = 46
                    pos += 1
                out[pos] = digs[k] if k < nd else 48
                pos += 1
        else:
            out[pos] = 48
            out[pos + 1] = 46
            pos += 2
            for _ in range(-e - 1):
                out[pos] = 48
                pos += 1
            for k in range(nd):
                out[pos] = digs[k]
                pos += 1
    else:
        out[pos] = digs[0]
        pos += 1
        if nd > 1:
            out[pos] = 46
            pos += 1
            for k in range(1, nd):
                out[pos] = digs[k]
                pos += 1
        out[pos] = 101
        pos += 1
        if e < 0:
            out[pos] = 45
            pos += 1
            e = -e
        pos = _write_uint(out, pos, e)
    return pos


@njit(cache=True, nogil=True)
def _format_rows(x_ptr, x_ind, x_dat, y_ptr, y_ind, r0, r1, out, pow10):
    pos = 0
    for r in range(r0, r1):
        for k in range(y_ptr[r], y_ptr[r + 1]):
            if k > y_ptr[r]:
                out[pos] = 44
                pos += 1
            pos = _write_uint(out, pos, y_ind[k])
        for k in range(x_ptr[r], x_ptr[r + 1]):
            out[pos] = 32
            pos = _write_uint(out, pos + 1, x_ind[k])
            out[pos] = 58
            pos = _write_float(out, pos + 1, x_dat[k], pow10)
        out[pos] = 10
        pos += 1
    return pos


def write_xc(path, X, Y, n_features=None, n_labels=None):
    """Write ``X`` (features) and ``Y`` (labels) in the XC repository format.

    Values are written with the fewest of 6..9 significant digits that read back to the same
    float32, so ``read_xc(path)`` returns exactly ``(X, Y)`` (canonical CSR form). A point with
    no labels is written as a line starting with a space; a point with neither labels nor
    features as an empty line.
    """
    X = as_feature_matrix(X, n_features=n_features, name="X")
    Y = as_label_matrix(Y, n_labels=n_labels, n_rows=X.shape[0], name="Y")
    n, d = X.shape
    L = Y.shape[1]
    x_ptr = X.indptr.astype(np.int64, copy=False)
    y_ptr = Y.indptr.astype(np.int64, copy=False)
    row_bytes = 11 * np.diff(y_ptr) + 28 * np.diff(x_ptr) + 2
    cum = np.concatenate([[0], np.cumsum(row_bytes)])
    with atomic_write(path, "wb") as f:     # a failed write leaves no partial data file
        f.write(f"{n} {d} {L}\n".encode())
        r0 = 0
        while r0 < n:
            r1 = int(np.searchsorted(cum, cum[r0] + _CHUNK, side="right")) - 1
            r1 = min(max(r1, r0 + 1), n)
            out = np.empty(int(cum[r1] - cum[r0]), dtype=np.uint8)
            m = _format_rows(x_ptr, X.indices, X.data, y_ptr, Y.indices, r0, r1, out, _POW10)
            f.write(memoryview(out)[:m])
            r0 = r1
