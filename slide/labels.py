"""Label names in, label names out: how a ``Y`` becomes the label-id CSR the kernels train on,
and the model's ``classes_``.

The rule (docs/text.md, "Labels: ids or names"):

- a scipy sparse matrix or a 2-D array is a 0/1 indicator matrix: its columns are labels
  ``0 .. n-1`` (ids), or the names given by ``classes=`` (``MultiLabelBinarizer``'s
  ``fit_transform`` output with its ``classes_``);
- a list of label lists: when every label is an integer (Python or NumPy, not a bool) and no
  ``classes=`` is given, the integers are label ids, as before (``classes_`` =
  ``0 .. largest id``); otherwise the labels are names (``classes_``: the distinct names,
  sorted where they compare, else in order of first appearance);
- a 1-D NumPy array (one label per row, scikit-learn's ``y`` of a classifier): its values are
  names, ``classes_ = np.unique(y)``, as every scikit-learn classifier reads ``y`` (a Python
  list of single integers stays a list of ids, as before);
- ``classes=`` given: every label must be one of them, in their order (integers then are names
  too).

A fitted model keeps ``classes_`` (the name of each output column) and ``named_labels_``
(whether ``Y`` was read as names).

``predict`` answers in scikit-learn's form for the target ``fit`` was given (``predictions``):
a multi-label ``Y`` (a matrix or label lists) gets a sparse 0/1 indicator matrix whose columns
are ``classes_``; a 1-D ``y`` (one label per row: scikit-learn's binary / multiclass target)
gets a 1-D array of ``classes_`` names, as every scikit-learn classifier answers such a
target. Which of the two a model was fitted on travels with it (checkpoints, pickling,
ensembles, shards). Later ``Y`` (``score``, ``partial_fit``, ``eval_set``,
a resumed ``fit``) are read the same way; a name the model was not fitted with is refused
(``ValueError`` naming the row and the name): its output layer has no neuron for it.
"""
import numbers

import numpy as np
import scipy.sparse as sp
from sklearn.utils.multiclass import type_of_target

from slide.data.inputs import as_label_matrix


def _is_int(v):
    return isinstance(v, (numbers.Integral, np.integer)) and not isinstance(v, (bool, np.bool_))


def _plain(v):
    """A NumPy scalar as the Python value it holds (so names hash and save alike)."""
    return v.item() if isinstance(v, np.generic) else v


def classes_array(names):
    """The names as a 1-D array: of str or int64 when they are all strings or all integers,
    else of objects (what ``MultiLabelBinarizer.classes_`` holds)."""
    names = [_plain(n) for n in names]
    if names and all(isinstance(n, str) for n in names):
        return np.array(names, dtype=str)
    if names and all(_is_int(n) for n in names):
        return np.array(names, dtype=np.int64)
    out = np.empty(len(names), dtype=object)
    out[:] = names
    return out


def _rows(Y, name):
    """Each row of label lists as a Python list of plain labels."""
    rows = []
    for i, row in enumerate(Y):
        if isinstance(row, (str, bytes)) or not hasattr(row, "__iter__"):
            raise ValueError(f"{name}[{i}] must be a list of labels, got {row!r}")
        if isinstance(row, np.ndarray) and row.ndim > 1:
            raise ValueError(f"{name}[{i}] must be a 1-D list of labels, got shape {row.shape}")
        items = [_plain(v) for v in row]
        for v in items:
            try:
                hash(v)
            except TypeError:
                raise ValueError(f"{name}[{i}] contains an unhashable label {v!r}") from None
        rows.append(items)
    return rows


def _is_one_d(Y):
    """A 1-D target (one label per row): a 1-D array, or a list of scalars."""
    if isinstance(Y, np.ndarray):
        return Y.ndim == 1
    if isinstance(Y, (list, tuple)):
        return len(Y) > 0 and all(isinstance(r, (str, bytes)) or np.ndim(r) == 0 for r in Y)
    return False


def _distinct(rows):
    seen = dict.fromkeys(v for r in rows for v in r)
    try:
        return sorted(seen)
    except TypeError:       # names that do not compare: in order of first appearance
        return list(seen)


def _lookup(rows, classes, name, n_rows):
    """CSR of name rows against the known ``classes`` (ValueError on an unseen name)."""
    index = {_plain(c): j for j, c in enumerate(classes)}
    lens = np.fromiter((len(r) for r in rows), np.int64, len(rows))
    ids = np.empty(int(lens.sum()), np.int64)
    at = 0
    for i, r in enumerate(rows):
        for v in r:
            j = index.get(v)
            if j is None:
                raise ValueError(f"{name}[{i}] has the label {v!r}, which is not among the "
                                 f"model's {len(classes)} classes_ (a name fit never saw has "
                                 f"no output neuron; pass every name as classes= to fit)")
            ids[at] = j
            at += 1
    ptr = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lens, out=ptr[1:])
    M = sp.csr_matrix((np.ones(ids.size, np.float32), ids, ptr), shape=(len(rows), len(classes)))
    return as_label_matrix(M, n_labels=len(classes), n_rows=n_rows, name=name)


def _as_input(Y, name):
    """``Y`` as a list, a NumPy array or a sparse matrix; a 1-D array checked the way
    scikit-learn checks a classifier's ``y`` (no NaN or inf, no continuous values)."""
    if Y is None:
        raise ValueError(f"this estimator requires y to be passed, but the target y is None "
                         f"({name}: the labels)")
    if not (sp.issparse(Y) or isinstance(Y, (list, tuple, np.ndarray))) and \
            hasattr(Y, "__array__"):
        Y = np.asarray(Y)
    if isinstance(Y, np.ndarray) and Y.ndim == 1 and Y.dtype.kind in "fc":
        kind = type_of_target(Y, input_name=name)       # raises on NaN and inf
        if kind.startswith("continuous"):
            raise ValueError(f"Unknown label type: {kind}: {name} holds continuous values, "
                             f"not labels")
    return Y


def _check_classes(classes):
    classes = classes_array(list(classes))
    if classes.ndim != 1 or classes.size == 0:
        raise ValueError("classes must be a non-empty 1-D list of label names")
    try:
        distinct = len({_plain(c) for c in classes})
    except TypeError:
        raise ValueError("classes must be hashable label names") from None
    if distinct != classes.size:
        raise ValueError("classes has repeated names")
    return classes


def encode(Y, n_rows=None, name="Y", classes=None):
    """``(CSR label matrix, names)`` of a ``Y`` read for a model not yet fitted: ``names`` is
    the ``classes_`` array when ``Y`` holds names (or ``classes`` was given), None for ids."""
    if classes is not None:
        classes = _check_classes(classes)
    Y = _as_input(Y, name)
    if sp.issparse(Y) or (isinstance(Y, np.ndarray) and Y.ndim == 2):
        n = None if classes is None else classes.size
        return as_label_matrix(Y, n_labels=n, n_rows=n_rows, name=name), classes
    if _is_one_d(Y):
        rows = [[_plain(v)] for v in Y]
        if classes is None and not isinstance(Y, np.ndarray) and all(
                _is_int(r[0]) for r in rows):
            return as_label_matrix(rows, n_rows=n_rows, name=name), None   # a list of ids
        if classes is None:
            classes = classes_array(_distinct(rows))
        return _lookup(rows, classes, name, n_rows), classes
    if not isinstance(Y, (list, tuple)):
        raise ValueError(f"{name} must be a 0/1 matrix, a list of label lists or a 1-D array "
                         f"of labels, got {type(Y).__name__}")
    rows = _rows(Y, name)
    if classes is None and all(_is_int(v) for r in rows for v in r):
        return as_label_matrix(Y, n_rows=n_rows, name=name), None      # label ids
    if classes is None:
        classes = classes_array(_distinct(rows))
        if classes.size == 0:
            raise ValueError(f"{name} has no labels")
    return _lookup(rows, classes, name, n_rows), classes


def encode_known(Y, model, n_rows=None, name="Y"):
    """The CSR label matrix of ``Y`` for the fitted ``model``: names against its
    ``classes_`` (an unseen name is refused), ids against its ``n_labels_``."""
    Y = _as_input(Y, name)
    if not getattr(model, "named_labels_", False):
        if _is_one_d(Y) and isinstance(Y, np.ndarray):
            Y = [[v] for v in Y.tolist()]
        return as_label_matrix(Y, n_labels=model.n_labels_, n_rows=n_rows, name=name)
    if sp.issparse(Y) or (isinstance(Y, np.ndarray) and Y.ndim == 2):
        return as_label_matrix(Y, n_labels=model.n_labels_, n_rows=n_rows, name=name)
    if _is_one_d(Y):
        rows = [[_plain(v)] for v in Y]
    elif isinstance(Y, (list, tuple)):
        rows = _rows(Y, name)
    else:
        raise ValueError(f"{name} must be a 0/1 matrix, a list of label lists or a 1-D array "
                         f"of labels, got {type(Y).__name__}")
    return _lookup(rows, model.classes_, name, n_rows)


def set_classes(model, names):
    """``classes_`` and ``named_labels_`` of a model with ``n_labels_`` output columns:
    ``names`` (an array of that length) or, for None, the ids ``0 .. n_labels_ - 1``."""
    if names is None:
        model.classes_ = np.arange(int(model.n_labels_), dtype=np.int64)
        model.named_labels_ = False
        return
    names = classes_array(list(names))
    if names.shape != (int(model.n_labels_),):
        raise ValueError(f"{names.size} label names for a model of {int(model.n_labels_)} "
                         f"labels")
    model.classes_ = names
    model.named_labels_ = True


def names_for_saving(model):
    """The label names as a JSON list (None for an id model); ValueError for names JSON
    cannot hold exactly (only strings and integers are saved)."""
    if not getattr(model, "named_labels_", False):
        return None
    out = []
    for c in model.classes_:
        c = _plain(c)
        if not (isinstance(c, str) or _is_int(c)):
            raise ValueError(f"label name {c!r} ({type(c).__name__}) cannot be saved: slide's "
                             f"format keeps string and integer names (joblib/pickle keep any)")
        out.append(c)
    return out


def names_of(model, ids):
    """``classes_[ids]`` (ids of any shape)."""
    return np.asarray(model.classes_)[np.asarray(ids)]


# ---------------------------------------------------------------------------------------------
# predict's answer

def one_label_per_row(Y):
    """Whether ``Y`` is a 1-D target (one label per row: scikit-learn's binary / multiclass
    ``y``, a 1-D array or a list of scalars) rather than a multi-label one."""
    if not (sp.issparse(Y) or isinstance(Y, (list, tuple, np.ndarray))) and \
            hasattr(Y, "__array__"):
        Y = np.asarray(Y)
    return _is_one_d(Y)


def set_target(model, one_d):
    """Record whether ``model`` was fitted on a 1-D target (``one_label_per_row``); what
    ``predictions`` answers follows it."""
    model._y_1d = bool(one_d)


def fitted_on_1d(model):
    """Whether ``model`` was fitted on a 1-D target (False for files and models from before
    the flag existed: they answer with the indicator matrix)."""
    return bool(getattr(model, "_y_1d", False))


def predict(model, X, k=1):
    """``predict`` of a fitted ``model`` (``SlideClassifier``, ``SlideEnsemble``,
    ``ShardedSlideClassifier``): scikit-learn's multi-label answer, the 0/1 indicator matrix
    of each row's ``k`` best labels of ``model.predict_topk`` (``predictions``), which
    ``sklearn.metrics`` takes as it takes a multi-label ``Y`` (``f1_score(Y, P,
    average="micro")``) and ``MultiLabelBinarizer(classes=model.classes_).fit([])
    .inverse_transform(P)`` turns into names; for a model fitted on a 1-D target, the 1-D
    array of each row's best label (``k`` must be 1). ``k`` rather than a probability
    threshold: the softmax shares a row's mass among all its labels, so one cut would keep
    fewer labels the more a row has (``predict_topk_scored`` / ``predict_proba`` give scores
    to cut at)."""
    if fitted_on_1d(model) and not (_is_int(k) and k == 1):
        raise ValueError(f"this model was fitted on a 1-D y (one label per row): predict "
                         f"returns that one label, so k must be 1, got {k!r}; "
                         f"predict_topk(X, k) ranks more labels")
    return predictions(model, model.predict_topk(X, k=k))


def indicator(ids, n_labels):
    """``scipy.sparse.csr_matrix`` (n, n_labels) of int8 ones at each row's ``ids`` (an
    (n, k) id matrix; negative ids, a short row's padding, are left out), column indices
    sorted within each row."""
    ids = np.sort(np.asarray(ids, dtype=np.int64).reshape(len(ids), -1), axis=1)
    keep = ids >= 0
    ptr = np.zeros(ids.shape[0] + 1, np.int64)
    np.cumsum(keep.sum(axis=1), out=ptr[1:])
    return sp.csr_matrix((np.ones(int(ptr[-1]), np.int8), ids[keep], ptr),
                         shape=(ids.shape[0], int(n_labels)))


def predictions(model, ids):
    """``predict``'s answer from the ranked ids (n, k) of ``predict_topk``: the 0/1 indicator
    matrix of those labels, its columns ordered as ``classes_`` (``indicator``), or, for a
    model fitted on a 1-D target, the best label's ``classes_`` name per row (1-D)."""
    if fitted_on_1d(model):
        return names_of(model, np.asarray(ids)[:, 0])
    return indicator(ids, model.n_labels_)
