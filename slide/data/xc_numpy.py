"""XC text read with NumPy alone: what ``read_xc`` uses while its parser kernel is not compiled.

A new user's first ``read_xc`` would otherwise wait for the byte parser
(``slide.kernels.parse._parse_chunk``) to compile: about four seconds on the AVX-512 host,
three times that on a Zen 3 one, longer than reading any file of a few tens of megabytes this
way (``docs/design.md``, "Reading a file before anything is compiled"). This reader takes only
text in a strict subset of the format and returns ``None`` for anything else (a stray space, a
carriage return, a duplicate feature, an index out of range, a value outside float32, fewer or
more lines than the header declares); the caller then parses with the kernel, which reports
the exact line and token. On the text it takes it returns the kernel's matrices bit for bit
(``tests/test_xc_numpy.py``): the same values (``float32(float64(text))``, correctly rounded
both ways), sorted indices, repeated labels counted once.
"""
import re
import warnings
from typing import NamedTuple

import numpy as np

# The subset taken: every line "labels features" with single spaces, a line without labels
# starting with its space, no line without a trailing newline but the last. Possessive
# repeats (Python 3.11's "*+"): the match keeps no state to backtrack into, so it takes a few
# megabytes where plain repeats took 1.3 GB on a 40 MB file. Python 3.10 has none: there the
# parser kernel reads every file.
_NUMBER = rb"[-+]?+(?:\d++(?:\.\d*+)?+|\.\d++)(?:[eE][-+]?+\d++)?+"
_LINE = rb"(?:\d++(?:,\d++)*+)?+(?: \d++:" + _NUMBER + rb")*+"
try:
    _BODY = re.compile(rb"(?:" + _LINE + rb"\n)*+(?:" + _LINE + rb")?+")
except re.error:
    _BODY = None
# every number of the body apart, in order: labels, then (index, value) pairs, line by line
_TO_SPACES = bytes.maketrans(b",:\n", b"   ")

SPACE, NEWLINE, COMMA, COLON = 32, 10, 44, 58


class XcArrays(NamedTuple):
    """The CSR pieces of X (features) and Y (labels), as the kernel's reader fills them."""
    x_data: np.ndarray       # float32
    x_indices: np.ndarray    # int32, sorted on each line
    x_indptr: np.ndarray     # int64
    y_indices: np.ndarray    # int32, sorted and distinct on each line
    y_indptr: np.ndarray     # int64


def parse_xc_body(body, n_rows, n_features, n_labels):
    """The ``XcArrays`` of the bytes after an XC header that declares ``n_rows`` points of
    ``n_features`` features and ``n_labels`` labels, or None where the text is outside this
    reader's subset (see the module's docstring)."""
    if _BODY is None or _BODY.fullmatch(body) is None:
        return None
    text = np.frombuffer(body, np.uint8)
    ends = np.flatnonzero(text == NEWLINE)
    if text.shape[0] and text[-1] != NEWLINE:
        ends = np.append(ends, text.shape[0])
    if ends.shape[0] != n_rows:
        return None
    if n_rows == 0:
        none = np.zeros(0, np.int32)
        return XcArrays(np.zeros(0, np.float32), none, np.zeros(1, np.int64), none,
                        np.zeros(1, np.int64))
    starts = np.concatenate(([0], ends[:-1] + 1))
    # a line has labels unless it is empty or starts with the space before its first feature
    has_labels = (starts < ends) & (text[np.minimum(starts, text.shape[0] - 1)] != SPACE)
    n_lab = np.where(has_labels, _per_line(text, COMMA, ends) + 1, 0)
    n_feat = _per_line(text, COLON, ends)
    numbers = _numbers(body, int(n_lab.sum() + 2 * n_feat.sum()))
    if numbers is None:
        return None
    labels, indices, values = _split(numbers, n_lab, n_feat)
    features = _features(indices, values, n_feat, n_rows, n_features)
    label_lists = _labels(labels, n_lab, n_rows, n_labels)
    if features is None or label_lists is None:
        return None
    return XcArrays(*features, *label_lists)


def _per_line(text, byte, ends):
    """How many times ``byte`` occurs on each line (lines end at ``ends``)."""
    before_end = np.searchsorted(np.flatnonzero(text == byte), ends)
    return np.diff(before_end, prepend=0)


def _numbers(body, expected):
    """Every number of the body as float64, or None unless there are ``expected`` of them."""
    with warnings.catch_warnings():
        # text it cannot read to the end is a warning, not an error: the count catches it
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            numbers = np.fromstring(body.translate(_TO_SPACES), dtype=np.float64, sep=" ")
        except ValueError:
            return None
    return numbers if numbers.shape[0] == expected else None


def _split(numbers, n_lab, n_feat):
    """The labels, feature indices and values out of the numbers in file order: a line's
    labels come first, then its (index, value) pairs."""
    per_line = n_lab + 2 * n_feat
    line_start = np.cumsum(per_line) - per_line
    # the q-th label of the file (the i-th of its line) is at line_start + i
    label_at = np.repeat(line_start - (np.cumsum(n_lab) - n_lab), n_lab) \
        + np.arange(n_lab.sum())
    # the k-th feature of the file (the j-th of its line) has its index at
    # line_start + n_lab + 2 j, its value next
    index_at = np.repeat(line_start + n_lab - 2 * (np.cumsum(n_feat) - n_feat), n_feat) \
        + 2 * np.arange(n_feat.sum())
    return numbers[label_at], numbers[index_at], numbers[index_at + 1]


def _features(indices, values, n_feat, n_rows, n_features):
    """X's (data, indices, indptr): each line's features sorted by index; None for an index
    out of range, a repeated index on a line, or a value float32 cannot hold (the kernel names
    them)."""
    if indices.shape[0] and indices.max() >= n_features:
        return None
    with np.errstate(over="ignore"):
        data = values.astype(np.float32)
    if not np.isfinite(data).all():
        return None
    key = np.repeat(np.arange(n_rows, dtype=np.int64), n_feat) * n_features \
        + indices.astype(np.int64)
    if key.shape[0] > 1 and not (key[1:] > key[:-1]).all():
        order = np.argsort(key, kind="stable")
        key, data = key[order], data[order]
        if (key[1:] == key[:-1]).any():
            return None
    indptr = np.concatenate(([0], np.cumsum(n_feat))).astype(np.int64)
    return data, (key % max(n_features, 1)).astype(np.int32), indptr


def _labels(labels, n_lab, n_rows, n_labels):
    """Y's (indices, indptr): each line's distinct labels, sorted; None for a label out of
    range."""
    if labels.shape[0] and labels.max() >= n_labels:
        return None
    n_lab = n_lab.copy()
    key = np.repeat(np.arange(n_rows, dtype=np.int64), n_lab) * n_labels \
        + labels.astype(np.int64)
    if key.shape[0] > 1 and not (key[1:] > key[:-1]).all():
        key = np.sort(key)
        repeated = np.flatnonzero(key[1:] == key[:-1]) + 1
        n_lab -= np.bincount(key[repeated] // n_labels, minlength=n_rows)
        key = np.delete(key, repeated)
    indptr = np.concatenate(([0], np.cumsum(n_lab))).astype(np.int64)
    return (key % max(n_labels, 1)).astype(np.int32), indptr
