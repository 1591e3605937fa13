"""Validation of user-supplied matrices and the seeded minibatch order.

``as_feature_matrix`` / ``as_label_matrix`` turn what a user passes (scipy sparse, dense 2-D, a
list of label lists) into the canonical CSR the kernels expect, with a ValueError naming the
argument otherwise; ``iterate_minibatches`` yields row ids of a permutation derived from
``(seed, epoch)`` (XC files are label-sorted: never train or evaluate in file order).
"""
import warnings

import numpy as np
import scipy.sparse as sp


_INT32_MAX = 2**31 - 1

# ---------------------------------------------------------------------------------------------
# validation of user input


def _index_dtype_ok(m):
    m.indices = m.indices.astype(np.int32, copy=False)
    if m.nnz <= _INT32_MAX:
        m.indptr = m.indptr.astype(np.int32, copy=False)
    return m


def take_rows(A, rows):
    """The rows ``rows`` (any order, repeats allowed) of the CSR matrix A as a new CSR matrix.
    scipy's ``A[rows]`` first casts the whole of A's index arrays to one dtype where indptr
    and indices differ (int64 indptr beside int32 indices): an int64 copy of Amazon-670K's
    37M input ids, 0.3 GB, to take 1,000 rows."""
    rows = np.asarray(rows, np.int64)
    starts = A.indptr[rows].astype(np.int64)
    lens = A.indptr[rows + 1].astype(np.int64) - starts
    indptr = np.zeros(rows.shape[0] + 1, np.int64)
    np.cumsum(lens, out=indptr[1:])
    gather = np.repeat(starts - indptr[:-1], lens) + np.arange(indptr[-1])
    return sp.csr_matrix((A.data[gather], A.indices[gather], indptr),
                         shape=(rows.shape[0], A.shape[1]))


def slice_rows(A, lo, hi):
    """Rows lo..hi-1 of the CSR matrix A (``A[lo:hi]`` without scipy's whole-matrix index
    cast; see ``take_rows``)."""
    p0, p1 = int(A.indptr[lo]), int(A.indptr[hi])
    return sp.csr_matrix((A.data[p0:p1], A.indices[p0:p1],
                          (A.indptr[lo:hi + 1] - p0).astype(np.int64)),
                         shape=(hi - lo, A.shape[1]))


def _checked_sparse(A, name, id_word, copy=True):
    """CSR of the scipy sparse ``A`` (any format, matrix or array), after checking its index
    structure with vectorised NumPy. ``copy=False``: a CSR ``A``'s arrays are shared, not
    copied (the caller must not change them in place).

    scipy builds ``csr_matrix((data, indices, indptr), shape=...)`` (and its CSC / COO
    siblings) without checking that the ids fit the shape; such a matrix reaches the kernels,
    which index without bounds checks (a segfault or heap corruption, or silently wrong
    results). So before any conversion -- itself compiled code that trusts the arrays -- ids
    must lie in ``[0, n)``, the pointer array must start at 0, never decrease and end at the
    stored entry count, and the arrays' lengths must agree. Raises ``ValueError`` naming
    ``name``, the row and the offending id, e.g. "X row 3 has feature id 35, but X has 30
    columns". The returned CSR may hold unsorted / duplicate ids (the callers sum and sort)."""
    if A.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got a {A.ndim}-D sparse array")
    n_rows, n_cols = (int(v) for v in A.shape)
    fmt = A.format
    if fmt not in ("csr", "csc", "coo"):
        # LIL, DOK, DIA and BSR: convert to COO in NumPy first (LIL and DOK check ids on
        # insertion; BSR's block ids are checked as COO coordinates below)
        try:
            A = A.tocoo()
        except Exception as exc:
            raise ValueError(f"{name} is a malformed {fmt.upper()} sparse matrix: {exc}") from None
        fmt = "coo"
    data = np.asarray(A.data)
    if data.ndim != 1:
        raise ValueError(f"{name}'s sparse data must be 1-D, got shape {data.shape}")
    if fmt == "coo":
        return _checked_coo(A, data, name, id_word, n_rows, n_cols)
    return _checked_compressed(A, data, fmt, name, id_word, n_rows, n_cols, copy)


def _checked_coo(A, data, name, id_word, n_rows, n_cols):
    """``_checked_sparse`` of a COO matrix: its row and column ids checked, then CSR."""
    coords = getattr(A, "coords", None)
    row, col = (coords if coords is not None else (A.row, A.col))
    row, col = np.asarray(row), np.asarray(col)
    for what, a in (("row", row), ("column", col)):
        if a.ndim != 1 or a.dtype.kind not in "iu":
            raise ValueError(f"{name}'s COO {what} ids must be a 1-D integer array, got "
                             f"{a.dtype} of shape {a.shape}")
    if not row.shape[0] == col.shape[0] == data.shape[0]:
        raise ValueError(f"{name}'s COO arrays disagree in length: {row.shape[0]} row ids, "
                         f"{col.shape[0]} column ids, {data.shape[0]} values")
    if row.size:
        bad = np.flatnonzero((row < 0) | (row >= n_rows))
        if bad.size:
            raise ValueError(f"{name} entry {int(bad[0])} has row id {int(row[bad[0]])}, but "
                             f"{name} has {n_rows} rows")
        bad = np.flatnonzero((col < 0) | (col >= n_cols))
        if bad.size:
            raise ValueError(f"{name} row {int(row[bad[0]])} has {id_word} id "
                             f"{int(col[bad[0]])}, but {name} has {n_cols} columns")
    return sp.csr_matrix((data, (row.astype(np.int64), col.astype(np.int64))),
                         shape=(n_rows, n_cols))


def _checked_compressed(A, data, fmt, name, id_word, n_rows, n_cols, copy=True):
    """``_checked_sparse`` of a CSR or CSC matrix: its index structure checked, then CSR."""
    # compressed: CSR rows (ids are columns) or CSC columns (ids are rows)
    indptr, indices = np.asarray(A.indptr), np.asarray(A.indices)
    n_major, n_minor = (n_rows, n_cols) if fmt == "csr" else (n_cols, n_rows)
    major, minor = ("row", "column") if fmt == "csr" else ("column", "row")
    for what, a in (("indptr", indptr), ("indices", indices)):
        if a.ndim != 1 or a.dtype.kind not in "iu":
            raise ValueError(f"{name}'s {fmt.upper()} {what} must be a 1-D integer array, got "
                             f"{a.dtype} of shape {a.shape}")
    if indptr.shape[0] != n_major + 1:
        raise ValueError(f"{name}'s {fmt.upper()} indptr has {indptr.shape[0]} entries, expected "
                         f"{n_major + 1} ({n_major} {major}s + 1)")
    if indices.shape[0] != data.shape[0]:
        raise ValueError(f"{name}'s {fmt.upper()} arrays disagree in length: "
                         f"{indices.shape[0]} indices, {data.shape[0]} values")
    if int(indptr[0]) != 0:
        raise ValueError(f"{name}'s {fmt.upper()} indptr starts at {int(indptr[0])}, not 0")
    steps = np.diff(indptr)
    if steps.size and int(steps.min()) < 0:
        at = int(np.flatnonzero(steps < 0)[0])
        raise ValueError(f"{name}'s {fmt.upper()} indptr decreases at {major} {at} "
                         f"({int(indptr[at])} -> {int(indptr[at + 1])})")
    if int(indptr[-1]) != indices.shape[0]:
        raise ValueError(f"{name}'s {fmt.upper()} indptr ends at {int(indptr[-1])}, but there are "
                         f"{indices.shape[0]} stored entries")
    if indices.size:
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= n_minor:
            pos = int(np.flatnonzero((indices < 0) | (indices >= n_minor))[0])
            at = int(np.searchsorted(indptr, pos, side="right") - 1)
            bad_id = int(indices[pos])
            if fmt == "csr":
                raise ValueError(f"{name} row {at} has {id_word} id {bad_id}, but {name} has "
                                 f"{n_cols} columns")
            raise ValueError(f"{name} (CSC) column {at} has row id {bad_id}, but {name} has "
                             f"{n_rows} rows")
    cls = sp.csr_matrix if fmt == "csr" else sp.csc_matrix
    M = cls((data, indices, indptr), shape=(n_rows, n_cols), copy=copy)
    return M if fmt == "csr" else M.tocsr()


def _shareable(M):
    """Whether the checked CSR ``M``, which may share the caller's arrays, can be used as it
    is: canonical (sorted ids, no duplicates: ``as_feature_matrix`` then changes nothing in
    place), and every array writable and contiguous (a read-only or strided array would
    compile the kernels anew for its type)."""
    arrays = (M.data, M.indices, M.indptr)
    return (all(a.flags.writeable and a.flags.c_contiguous for a in arrays)
            and bool(M.has_canonical_format))


def as_feature_matrix(X, n_features=None, name="X"):
    """Validate ``X`` (scipy sparse or dense 2-D) and return canonical CSR.

    Canonical: float32 data, int32 sorted indices, duplicates summed. A CSR ``X`` that is so
    already (with writable, contiguous arrays) shares its arrays with the result; ``X`` itself
    is never changed. Raises ``ValueError``
    naming ``name`` for a wrong dimensionality, non-numeric or non-finite values, values outside
    the float32 range, a column count different from ``n_features``, or a sparse matrix whose
    index arrays do not fit its shape (a feature id outside ``[0, n_columns)``, a malformed
    indptr; ``_checked_sparse``, checked before any conversion).
    """
    if sp.issparse(X):
        if X.ndim != 2:
            raise ValueError(f"{name} must be 2-D, got a {X.ndim}-D sparse array")
        if X.dtype.kind not in "biuf":
            raise ValueError(f"{name} must have a real numeric dtype, got {X.dtype}")
        # the caller's arrays are shared where nothing below would change them in place (sum
        # and sort are no-ops on canonical CSR) and the kernels take them as they are: at
        # Amazon-670K's shape a copy was 0.28 GiB of the fit's peak memory
        M = _checked_sparse(X, name, "feature", copy=False)
        if not _shareable(M):
            M = M.copy()
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
        raise ValueError(f"{name} contains a non-finite value (NaN or inf: {data[bad]!r} at "
                         f"row {row}, column {int(M.indices[bad])})")
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


def _warn_if_stray_label(ids, name):
    """UserWarning when the label count inferred from label lists looks set by one mistyped id:
    more than half of the ids ``0 .. max`` unused and the largest id more than 10 times the
    second largest distinct one (and above 10). The output layer has ``max + 1`` neurons, so
    one stray id would silently widen it (pass ``n_labels`` to make it an error instead)."""
    distinct = np.unique(ids)
    if distinct.size < 2:
        return
    top, second = int(distinct[-1]), int(distinct[-2])
    if 2 * distinct.size < top + 1 and top > 10 * max(second, 1):
        warnings.warn(f"{name}: label id {top} is more than 10 times the next largest ({second}) "
                      f"and {top + 1 - distinct.size} of the {top + 1} inferred label ids are "
                      "unused: is it mistyped? (pass n_labels to check the ids against it)",
                      UserWarning, stacklevel=4)


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
        _warn_if_stray_label(ind, name)
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
    label lists (a Python list is always read as label lists, never as a dense matrix; without
    ``n_labels`` the label count is the largest id + 1, with a ``UserWarning`` when that id looks
    mistyped: see ``_warn_if_stray_label``). Repeated
    labels count once. Raises ``ValueError`` naming ``name`` for negative, non-integer or
    out-of-range labels (in a sparse matrix: an id outside its columns or a malformed indptr,
    checked before any conversion: ``_checked_sparse``), values other than 0/1, or a row count
    different from ``n_rows``.
    """
    if n_labels is not None and (not isinstance(n_labels, (int, np.integer)) or n_labels < 0):
        raise ValueError(f"n_labels must be a non-negative integer, got {n_labels!r}")
    if isinstance(Y, (list, tuple)):
        M = _labels_from_lists(Y, n_labels, name)
    else:
        if sp.issparse(Y):
            M = _checked_sparse(Y, name, "label")
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


# a stream of its own for the label caps, apart from the batch order's [seed, epoch]
_CAP_STREAM = 0x6361


def cap_row_labels(Y, cap, seed):
    """``Y`` (CSR, sorted indices) with every row of more than ``cap`` labels cut to ``cap`` of
    them, drawn uniformly without replacement from ``np.random.default_rng([seed,
    _CAP_STREAM])`` (deterministic for ``seed``) and kept in sorted order; ``Y`` itself when
    no row exceeds ``cap`` or ``cap`` is 0. Why (``SlideClassifier(max_row_labels=...)``):
    a row's labels share its softmax target and each counts once in the label prior, the
    frequency draws, the neighbour vote and the linear classifiers, so a few rows of
    thousands of labels (debcontents' longest hold 9,076; its rows of over 1,000 labels hold
    37 % of its label occurrences) weighed on all of them; cut to 256, P@1 rose by a point
    and fit took 12 % less (bench/results/label_cap_debcontents_b493e94.log)."""
    cap = int(cap)
    lengths = np.diff(Y.indptr)
    long_rows = np.flatnonzero(lengths > cap) if cap > 0 else lengths[:0]
    if long_rows.shape[0] == 0:
        return Y
    rng = np.random.default_rng([int(seed), _CAP_STREAM])
    keep = np.ones(Y.indices.shape[0], bool)
    for r in long_rows:
        lo, n = int(Y.indptr[r]), int(lengths[r])
        keep[lo + rng.choice(n, n - cap, replace=False)] = False
    indptr = np.zeros(Y.shape[0] + 1, Y.indptr.dtype)
    np.cumsum(np.minimum(lengths, cap), out=indptr[1:])
    out = sp.csr_matrix((Y.data[keep], Y.indices[keep], indptr), shape=Y.shape)
    # Y's own index dtypes: scipy's constructor narrows them where they fit, and the kernels
    # specialise on them; a cut Y of other dtypes than the warm-up's compiled block_forward and
    # block_loss again inside the clock (~10 s of a cold fit on debdeps)
    out.indptr = out.indptr.astype(Y.indptr.dtype, copy=False)
    out.indices = out.indices.astype(Y.indices.dtype, copy=False)
    return out
