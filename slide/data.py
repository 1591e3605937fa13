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
output CSR plus one chunk (no per-token Python loop). A value is read as ``float32(float64(text))``
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
from numba import njit

from slide.fileio import atomic_write

__all__ = [
    "DataFormatError",
    "read_xc",
    "write_xc",
    "read_split",
    "read_libsvm",
    "as_feature_matrix",
    "as_label_matrix",
    "iterate_minibatches",
]

_CHUNK = 1 << 25  # 32 MiB of text per parser call
_HARD_CAP = 4096  # values the kernel hands to Python's float() per call
_INT32_MAX = 2**31 - 1


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
# kernels

# modes of the line parser
_MODE_XC = 0  # [labels] features
_MODE_FEATURES = 1  # idx:val tokens only
_MODE_LABELS = 2  # idx or idx:val tokens, all labels

# error codes reported by the kernel
_E_NONE = 0
_E_MALFORMED = 1
_E_NONNUMERIC = 2
_E_NEG_INDEX = 3
_E_INDEX_RANGE = 4
_E_LABEL = 5  # label is not a non-negative integer
_E_LABEL_RANGE = 6
_E_DUPLICATE = 7
_E_EXTRA_LINE = 8
_E_NEG_LABEL = 9

# kernel return status
_S_DONE = 0
_S_ERROR = 1
_S_HARD_FULL = 2

# state slots
_ST_ROW = 0
_ST_NNZX = 1
_ST_NNZY = 2
_ST_NHARD = 3
_ST_LINES = 4
_ST_UNSORTED = 5

_POW10 = np.array([10.0**i for i in range(23)], dtype=np.float64)


@njit(cache=True, nogil=True, inline="always")
def _is_space(c):
    return c == 32 or c == 9 or c == 13 or c == 11 or c == 12


@njit(cache=True, nogil=True)
def _parse_uint(buf, a, b):
    """Digits-only non-negative integer in buf[a:b]; -1 if malformed/empty, -2 if > int32 max."""
    if a >= b:
        return -1
    v = np.int64(0)
    for i in range(a, b):
        c = buf[i]
        if c < 48 or c > 57:
            return -1
        v = v * 10 + (c - 48)
        if v > 2147483647:
            # keep scanning so that garbage after the digits is still "malformed"
            for j in range(i + 1, b):
                if buf[j] < 48 or buf[j] > 57:
                    return -1
            return -2
    return v


@njit(cache=True, nogil=True)
def _parse_float(buf, a, b, pow10):
    """Parse buf[a:b] as a decimal number.

    Returns (status, value): status 0 = exact float64 value (fast path), 1 = syntactically valid
    but outside the exact fast path (caller uses Python's float), 2 = not a number.
    """
    i = a
    neg = False
    if i < b and (buf[i] == 45 or buf[i] == 43):
        neg = buf[i] == 45
        i += 1
    mant = np.int64(0)
    nsig = 0
    exp10 = 0
    ndigits = 0
    inexact = False
    while i < b and buf[i] >= 48 and buf[i] <= 57:
        d = buf[i] - 48
        ndigits += 1
        if nsig < 18:
            mant = mant * 10 + d
            if mant > 0:
                nsig += 1
        else:
            exp10 += 1
            if d != 0:
                inexact = True
        i += 1
    if i < b and buf[i] == 46:
        i += 1
        while i < b and buf[i] >= 48 and buf[i] <= 57:
            d = buf[i] - 48
            ndigits += 1
            if nsig < 18:
                mant = mant * 10 + d
                exp10 -= 1
                if mant > 0:
                    nsig += 1
            elif d != 0:
                inexact = True
            i += 1
    if ndigits == 0:
        return 2, 0.0
    if i < b and (buf[i] == 101 or buf[i] == 69):
        i += 1
        eneg = False
        if i < b and (buf[i] == 45 or buf[i] == 43):
            eneg = buf[i] == 45
            i += 1
        if i >= b:
            return 2, 0.0
        ev = 0
        while i < b and buf[i] >= 48 and buf[i] <= 57:
            if ev < 100000:
                ev = ev * 10 + (buf[i] - 48)
            i += 1
        if eneg:
            ev = -ev
        exp10 += ev
    if i != b:
        return 2, 0.0
    if mant == 0:
        return 0, (-0.0 if neg else 0.0)
    if inexact or mant > 9007199254740992:
        return 1, 0.0
    if exp10 == 0:
        v = np.float64(mant)
    elif 0 < exp10 <= 22:
        v = np.float64(mant) * pow10[exp10]
    elif -22 <= exp10 < 0:
        v = np.float64(mant) / pow10[-exp10]
    else:
        return 1, 0.0
    if neg:
        v = -v
    return 0, v


@njit(cache=True, nogil=True)
def _find_colon(buf, a, b):
    for i in range(a, b):
        if buf[i] == 58:
            return i
    return -1


@njit(cache=True, nogil=True)
def _sort_line(ind, dat, a, b, hard, n_hard, line_id):
    """Sort ind[a:b] (with dat) and move the x-positions of this line's pending hard values."""
    order = np.argsort(ind[a:b], kind="mergesort")
    ti = ind[a:b][order]
    td = dat[a:b][order]
    ind[a:b] = ti
    dat[a:b] = td
    # inverse permutation: old local position -> new local position
    inv = np.empty(b - a, dtype=np.int64)
    for k in range(b - a):
        inv[order[k]] = k
    for h in range(n_hard - 1, -1, -1):
        if hard[h, 5] != line_id:
            break
        if hard[h, 0] >= a:
            hard[h, 0] = a + inv[hard[h, 0] - a]


@njit(cache=True, nogil=True)
def _parse_chunk(buf, start, end, mode, skip_blank, max_rows, n_cols_x, n_cols_y,
                 x_ind, x_dat, y_ind, x_ptr, y_ptr, state, hard, err, pow10):
    """Parse whole lines of buf[start:end] (end is a line end or EOF).

    Returns (status, position reached). On error, ``err`` holds (code, line id, token start,
    token end, extra); line id counts all lines after the header from 0.
    """
    row = state[_ST_ROW]
    nx = state[_ST_NNZX]
    ny = state[_ST_NNZY]
    n_hard = state[_ST_NHARD]
    lines = state[_ST_LINES]
    hard_cap = hard.shape[0]
    pos = start
    status = _S_DONE
    code = _E_NONE
    while pos < end:
        if n_hard + 256 > hard_cap:
            status = _S_HARD_FULL
            break
        le = pos
        while le < end and buf[le] != 10:
            le += 1
        # blank line?
        p = pos
        while p < le and _is_space(buf[p]):
            p += 1
        blank = p == le
        if blank and skip_blank:
            lines += 1
            pos = le + 1
            continue
        if row >= max_rows:
            if blank:
                lines += 1
                pos = le + 1
                continue
            q = p
            while q < le and not _is_space(buf[q]):
                q += 1
            code = _E_EXTRA_LINE
            err[2] = p
            err[3] = q
            break
        x0 = nx
        y0 = ny
        x_sorted = True
        y_sorted = True
        first = True
        p = pos
        while True:
            while p < le and _is_space(buf[p]):
                p += 1
            if p >= le:
                break
            q = p
            while q < le and not _is_space(buf[q]):
                q += 1
            # token buf[p:q]
            err[2] = p
            err[3] = q
            colon = _find_colon(buf, p, q)
            if mode == _MODE_LABELS or (mode == _MODE_XC and first and p == pos and colon < 0):
                # label token: comma separated (XC) or idx[:val] (split label file)
                if mode == _MODE_LABELS:
                    lb = q
                    if colon >= 0:
                        lb = colon
                        if _find_colon(buf, colon + 1, q) >= 0 or colon + 1 == q:
                            code = _E_MALFORMED
                            break
                        st, _v = _parse_float(buf, colon + 1, q, pow10)
                        if st == 2:
                            code = _E_NONNUMERIC
                            break
                    items_end = lb
                else:
                    items_end = q
                a = p
                while a <= items_end:
                    c = a
                    while c < items_end and buf[c] != 44:
                        c += 1
                    if mode == _MODE_LABELS and c < items_end:
                        code = _E_MALFORMED
                        break
                    if c == a:
                        code = _E_MALFORMED
                        break
                    v = _parse_uint(buf, a, c)
                    if v == -1:
                        if buf[a] == 45 and _parse_uint(buf, a + 1, c) != -1:
                            code = _E_NEG_LABEL
                        else:
                            code = _E_LABEL
                        break
                    if v == -2 or v >= n_cols_y:
                        code = _E_LABEL_RANGE
                        err[4] = v
                        break
                    if ny > y0 and v <= y_ind[ny - 1]:
                        y_sorted = False
                    y_ind[ny] = v
                    ny += 1
                    a = c + 1
                if code != _E_NONE:
                    break
            else:
                if colon < 0 or colon == p or colon + 1 == q:
                    code = _E_MALFORMED
                    break
                if _find_colon(buf, colon + 1, q) >= 0:
                    code = _E_MALFORMED
                    break
                v = _parse_uint(buf, p, colon)
                if v == -1:
                    if buf[p] == 45 and _parse_uint(buf, p + 1, colon) != -1:
                        code = _E_NEG_INDEX
                    else:
                        code = _E_MALFORMED
                    break
                if v == -2 or v >= n_cols_x:
                    code = _E_INDEX_RANGE
                    err[4] = v
                    break
                st, val = _parse_float(buf, colon + 1, q, pow10)
                if st == 2:
                    code = _E_NONNUMERIC
                    break
                if nx > x0 and v <= x_ind[nx - 1]:
                    x_sorted = False
                x_ind[nx] = v
                if st == 1:
                    hard[n_hard, 0] = nx
                    hard[n_hard, 1] = colon + 1
                    hard[n_hard, 2] = q
                    hard[n_hard, 3] = p
                    hard[n_hard, 4] = q
                    hard[n_hard, 5] = lines
                    n_hard += 1
                    x_dat[nx] = 0.0
                else:
                    x_dat[nx] = np.float32(val)
                nx += 1
                if n_hard >= hard_cap:
                    # absurdly many hard values on one line: let Python handle the rest
                    code = _E_NONE
                    status = _S_HARD_FULL
                    break
            first = False
            p = q
        if status == _S_HARD_FULL and code == _E_NONE:
            # roll back this line and hand the hard values to Python first
            while n_hard > 0 and hard[n_hard - 1, 5] == lines:
                n_hard -= 1
            nx = x0
            ny = y0
            break  # if pos == start, one line has more hard values than fit: caller grows `hard`
        if code != _E_NONE:
            break
        if not x_sorted:
            _sort_line(x_ind, x_dat, x0, nx, hard, n_hard, lines)
            state[_ST_UNSORTED] = 1
            for k in range(x0 + 1, nx):
                if x_ind[k] == x_ind[k - 1]:
                    code = _E_DUPLICATE
                    err[4] = x_ind[k]
                    break
            if code != _E_NONE:
                err[2] = pos
                err[3] = le
                break
        if not y_sorted:
            tmp = np.sort(y_ind[y0:ny])
            m = 0
            for k in range(tmp.shape[0]):
                if m == 0 or tmp[k] != y_ind[y0 + m - 1]:
                    y_ind[y0 + m] = tmp[k]
                    m += 1
            ny = y0 + m
        row += 1
        x_ptr[row] = nx
        y_ptr[row] = ny
        lines += 1
        pos = le + 1
    if code != _E_NONE:
        status = _S_ERROR
        err[0] = code
        err[1] = lines
    state[_ST_ROW] = row
    state[_ST_NNZX] = nx
    state[_ST_NNZY] = ny
    state[_ST_NHARD] = n_hard
    state[_ST_LINES] = lines
    return status, pos


@njit(cache=True, nogil=True)
def _count_bytes(buf, n, counts, prev):
    """Accumulate newlines, colons, commas and token starts of buf[:n]; returns the last byte."""
    nl = 0
    co = 0
    cm = 0
    ts = 0
    for i in range(n):
        c = buf[i]
        if c == 10:
            nl += 1
        elif c == 58:
            co += 1
        elif c == 44:
            cm += 1
        if not (c == 10 or _is_space(c)) and (prev == 10 or _is_space(prev)):
            ts += 1
        prev = c
    counts[0] += nl
    counts[1] += co
    counts[2] += cm
    counts[3] += ts
    return prev


@njit(cache=True, nogil=True)
def _last_newline(buf, n):
    for i in range(n - 1, -1, -1):
        if buf[i] == 10:
            return i
    return -1


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
        hard = np.zeros((_HARD_CAP, 6), dtype=np.int64)
        err = np.zeros(5, dtype=np.int64)
        ctx = {"n_features": n_cols_x, "n_labels": n_cols_y, "n_rows": n_rows}

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
                                           x_ind, x_dat, y_ind, x_ptr, y_ptr, state, hard, err,
                                           _POW10)
                if state[_ST_NHARD]:
                    _fix_hard(path, buf, hard, int(state[_ST_NHARD]), x_dat, header_lines)
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


def read_xc(path):
    """Read an Extreme Classification Repository file.

    Returns ``(X, Y)``: ``X`` a CSR matrix (float32 values, int32 sorted indices, no duplicates;
    explicit zeros in the file are kept) of shape ``(num_points, num_features)``; ``Y`` a CSR
    matrix of float32 ones with int32 sorted indices of shape ``(num_points, num_labels)``
    (repeated labels on a line count once). Raises :class:`DataFormatError` for bad input.
    Remember that repository files are sorted by label: never train in file order.
    """
    path = _check_path(path)
    return _parse_file(path, _MODE_XC, True, None, None, None, False)


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


@njit(cache=True, nogil=True)
def _write_float(out, pos, v32, pow10):
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
    e0 = int(np.floor(np.log10(a)))
    m = np.int64(0)
    e = e0
    for p in range(6, 10):
        m, e = _digits(a, p, e0)
        if p == 9:
            break
        # does m * 10**(e - p + 1) read back (float32(float64(text))) as the same float32?
        x = e - p + 1
        if x == 0:
            back = np.float64(m)
        elif 0 < x <= 22:
            back = np.float64(m) * pow10[x]
        elif -22 <= x < 0:
            back = np.float64(m) / pow10[-x]
        else:
            continue
        if np.float32(back) == np.float32(a):
            break
    # strip trailing zeros
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


# ---------------------------------------------------------------------------------------------
# validation of user input


def _index_dtype_ok(m):
    m.indices = m.indices.astype(np.int32, copy=False)
    if m.nnz <= _INT32_MAX:
        m.indptr = m.indptr.astype(np.int32, copy=False)
    return m


def as_feature_matrix(X, n_features=None, name="X"):
    """Validate ``X`` (scipy sparse or dense 2-D) and return canonical CSR.

    Canonical: float32 data, int32 sorted indices, duplicates summed. Raises ``ValueError``
    naming ``name`` for a wrong dimensionality, non-numeric or non-finite values, values outside
    the float32 range, or a column count different from ``n_features``.
    """
    if sp.issparse(X):
        if X.ndim != 2:
            raise ValueError(f"{name} must be 2-D, got a {X.ndim}-D sparse array")
        if X.dtype.kind not in "biuf":
            raise ValueError(f"{name} must have a real numeric dtype, got {X.dtype}")
        M = sp.csr_matrix(X, copy=True)
    else:
        try:
            arr = np.asarray(X)
        except Exception as exc:  # ragged input and the like
            raise ValueError(f"{name} must be a 2-D array or a scipy sparse matrix: "
                             f"{exc}") from None
        if arr.ndim != 2:
            raise ValueError(f"{name} must be 2-D (n_samples, n_features), got shape {arr.shape}")
        if arr.dtype.kind not in "biuf":
            raise ValueError(f"{name} must have a real numeric dtype, got {arr.dtype}")
        M = sp.csr_matrix(arr)
    if M.shape[1] > _INT32_MAX:
        raise ValueError(f"{name} has {M.shape[1]} columns, more than int32 indices allow")
    data = M.data
    if data.dtype.kind == "f" and not np.isfinite(data).all():
        bad = int(np.flatnonzero(~np.isfinite(data))[0])
        row = int(np.searchsorted(M.indptr, bad, side="right") - 1)
        raise ValueError(f"{name} contains a non-finite value ({data[bad]!r} at row {row}, "
                         f"column {int(M.indices[bad])})")
    M.sum_duplicates()  # sorts indices too
    with np.errstate(over="ignore"):
        M.data = M.data.astype(np.float32, copy=False)
    if M.data.size and not np.isfinite(M.data).all():
        raise ValueError(f"{name} contains values outside the float32 range (or duplicate "
                         "entries whose sum is)")
    M = _index_dtype_ok(M)
    M.sort_indices()
    if n_features is not None and M.shape[1] != n_features:
        raise ValueError(f"{name} has {M.shape[1]} features (columns), expected {n_features}")
    return M


def _labels_from_lists(Y, n_labels, name):
    lens = np.empty(len(Y), dtype=np.int64)
    parts = []
    for i, row in enumerate(Y):
        if isinstance(row, (str, bytes)) or np.ndim(row) > 1:
            raise ValueError(f"{name}[{i}] must be a list of integer labels, got {row!r}")
        try:
            a = np.asarray(list(row) if isinstance(row, (set, frozenset)) else row).ravel()
        except Exception:
            raise ValueError(f"{name}[{i}] must be a list of integer labels, got {row!r}") from None
        if a.size and a.dtype.kind not in "iuf":
            if a.dtype.kind == "b":
                raise ValueError(f"{name}[{i}] contains booleans, expected integer labels")
            try:
                a = a.astype(np.float64)
            except (TypeError, ValueError):
                raise ValueError(f"{name}[{i}] contains non-integer labels: {row!r}") from None
        if a.dtype.kind == "f":
            if not (np.isfinite(a).all() and (a == np.round(a)).all()):
                raise ValueError(f"{name}[{i}] contains non-integer labels: {row!r}")
        a = a.astype(np.int64)
        if a.size and a.min() < 0:
            raise ValueError(f"{name}[{i}] contains a negative label ({int(a.min())})")
        lens[i] = a.size
        parts.append(a)
    ind = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    top = int(ind.max()) + 1 if ind.size else 0
    if n_labels is None:
        n_labels = top
    elif top > n_labels:
        row = next(i for i, a in enumerate(parts) if a.size and a.max() >= n_labels)
        raise ValueError(f"{name}[{row}] contains label {int(parts[row].max())} >= n_labels = "
                         f"{n_labels}")
    ptr = np.zeros(len(Y) + 1, dtype=np.int64)
    np.cumsum(lens, out=ptr[1:])
    M = sp.csr_matrix((np.ones(ind.size, dtype=np.float32), ind, ptr), shape=(len(Y), n_labels))
    return M


def as_label_matrix(Y, n_labels=None, n_rows=None, name="Y"):
    """Validate labels and return canonical CSR (float32 ones, int32 sorted indices).

    Accepts a scipy sparse 0/1 matrix, a dense 0/1 NumPy array, or a Python list (or tuple) of
    label lists (a Python list is always read as label lists, never as a dense matrix). Repeated
    labels count once. Raises ``ValueError`` naming ``name`` for negative, non-integer or
    out-of-range labels, values other than 0/1, or a row count different from ``n_rows``.
    """
    if n_labels is not None and (not isinstance(n_labels, (int, np.integer)) or n_labels < 0):
        raise ValueError(f"n_labels must be a non-negative integer, got {n_labels!r}")
    if isinstance(Y, (list, tuple)):
        M = _labels_from_lists(Y, n_labels, name)
    else:
        if sp.issparse(Y):
            if Y.ndim != 2:
                raise ValueError(f"{name} must be 2-D, got a {Y.ndim}-D sparse array")
            M = sp.csr_matrix(Y, copy=True)
        else:
            arr = np.asarray(Y)
            if arr.ndim != 2:
                raise ValueError(f"{name} must be a 2-D 0/1 array, a sparse matrix or a list of "
                                 f"label lists, got shape {arr.shape}")
            if arr.dtype.kind not in "biuf":
                raise ValueError(f"{name} must be numeric 0/1, got dtype {arr.dtype}")
            M = sp.csr_matrix(arr)
        if M.dtype.kind not in "biuf":
            raise ValueError(f"{name} must be numeric 0/1, got dtype {M.dtype}")
        d = M.data
        bad = ~((d == 0) | (d == 1))
        if bad.any():
            raise ValueError(f"{name} must contain only 0/1 values, found {d[bad][0]!r}")
        M.eliminate_zeros()
        if n_labels is not None and M.shape[1] != n_labels:
            raise ValueError(f"{name} has {M.shape[1]} label columns, expected n_labels = "
                             f"{n_labels}")
    if M.shape[1] > _INT32_MAX:
        raise ValueError(f"{name} has too many label columns for int32 indices")
    M.sum_duplicates()
    M.data = np.ones(M.nnz, dtype=np.float32)
    M = _index_dtype_ok(M)
    M.sort_indices()
    if n_rows is not None and M.shape[0] != n_rows:
        raise ValueError(f"{name} has {M.shape[0]} rows, expected {n_rows}")
    return M


# ---------------------------------------------------------------------------------------------
# batching


def iterate_minibatches(n_rows, batch_size, seed, epoch=0, start_batch=0):
    """Yield int64 arrays of row ids: a permutation of ``range(n_rows)`` cut into batches.

    The permutation is ``np.random.default_rng([seed, epoch]).permutation(n_rows)``, so it is
    deterministic for ``(seed, epoch)`` and differs between epochs. The last batch may be
    smaller. ``start_batch`` skips the first batches (exact resume). Never train or evaluate on
    XC repository files in file order: they are sorted by label.
    """
    for name, v in (("n_rows", n_rows), ("batch_size", batch_size), ("seed", seed),
                    ("epoch", epoch), ("start_batch", start_batch)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    perm = np.random.default_rng([int(seed), int(epoch)]).permutation(int(n_rows))
    perm = perm.astype(np.int64, copy=False)
    for i in range(int(start_batch) * int(batch_size), int(n_rows), int(batch_size)):
        yield perm[i:i + batch_size]
