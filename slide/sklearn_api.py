"""The scikit-learn face of ``SlideClassifier`` (a mixin it inherits): what every entry point
does with ``X`` and ``Y`` before a kernel runs (``slide.data``'s validators; label names and
ids through ``slide.labels``), the checks scikit-learn's estimator checks probe in the words
they expect, the estimator tags, the vote's settings fixed at ``fit`` (``set_params``
afterwards does not change predictions) and pickling through the checkpoint format
(``slide.persist.pickling``)."""
from numbers import Integral, Real

import numpy as np
from sklearn.utils._param_validation import Interval, StrOptions

from slide import labels as labels_mod
from slide import params as params_mod
from slide.data import as_feature_matrix
from slide.persist import pickling


class ScikitLearnAPI:
    """Input checks, tags, fitted vote settings and pickling of ``SlideClassifier``."""

    def _check_data(self, X, Y=None, fitted=False, training=False):
        """Canonical CSR of X (and Y) through ``slide.data``'s validators, which every entry
        point that reaches a kernel goes through. ``training``: Y must have a positive label
        (a model cannot learn from none; rows without labels are fine). Y of a fitted model
        is read against its ``classes_`` (``slide.labels``)."""
        X = self._check_X(X, fitted)
        if Y is None:
            return X
        if fitted:
            Y = labels_mod.encode_known(Y, self, n_rows=X.shape[0], name="Y")
        else:
            Y, _ = labels_mod.encode(Y, n_rows=X.shape[0], name="Y")
        return X, self._check_Y(Y, training)

    def _check_training_data(self, X, Y, fitted, classes):
        """``(X, Y, names)`` of a ``fit`` / ``partial_fit``: ``names`` the ``classes_`` that a
        fresh model takes from Y or ``classes`` (None: label ids; ``slide.labels``). A fresh
        model also records whether Y is a 1-D target (``slide.labels.set_target``: what
        ``predict`` returns follows it)."""
        X = self._check_X(X, fitted)
        if fitted:
            if classes is not None and not np.array_equal(
                    labels_mod.classes_array(list(classes)), self.classes_):
                raise ValueError("classes differs from the fitted model's classes_")
            Y, names = labels_mod.encode_known(Y, self, n_rows=X.shape[0], name="Y"), None
            return X, self._check_Y(Y, True), names
        one_d = labels_mod.one_label_per_row(Y)
        Y, names = labels_mod.encode(Y, n_rows=X.shape[0], name="Y", classes=classes)
        Y = self._check_Y(Y, True)
        labels_mod.set_target(self, one_d)      # once Y is valid: a refused fit records nothing
        return X, Y, names

    def _check_X(self, X, fitted):
        self._check_X_shape(X, fitted)
        n_features = self.n_features_in_ if fitted else None
        X = as_feature_matrix(X, n_features=n_features, name="X")
        if X.shape[0] == 0:
            raise ValueError("X has no rows")
        X.indptr = X.indptr.astype(np.int64, copy=False)
        return X

    def _check_X_shape(self, X, fitted):
        """The problems scikit-learn's estimator checks probe, in the words they expect
        (``slide.data.as_feature_matrix`` checks the rest)."""
        shape, dtype = getattr(X, "shape", None), getattr(X, "dtype", None)
        if dtype is not None and np.dtype(dtype).kind == "c":
            raise ValueError("X is complex: Complex data not supported")
        if shape is None:
            return
        if len(shape) == 1:
            raise ValueError(f"X must be 2-D (n_samples, n_features), got shape {shape}: "
                             f"Reshape your data with X.reshape(-1, 1) for a single feature "
                             f"or X.reshape(1, -1) for a single sample")
        if len(shape) == 2 and shape[0] > 0 and shape[1] == 0:
            raise ValueError(f"X has 0 feature(s) (shape={tuple(shape)}) while a minimum of 1 "
                             f"is required.")
        if fitted and len(shape) == 2 and shape[1] != self.n_features_in_:
            raise ValueError(f"X has {shape[1]} features, but {type(self).__name__} is "
                             f"expecting {self.n_features_in_} features as input")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True           # CSR is the native input
        tags.classifier_tags.multi_label = True
        return tags

    @staticmethod
    def _check_Y(Y, training):
        if training and Y.nnz == 0:
            raise ValueError(f"Y has no positive labels (all {Y.shape[0]} rows are empty): "
                             "nothing to train on")
        if Y.shape[1] == 0:
            raise ValueError("Y has no label columns")
        Y.indptr = Y.indptr.astype(np.int64, copy=False)
        return Y

    def _fix_vote_settings(self):
        """``neighbours_``, ``neighbour_weight_``, ``rerank_``: the vote's settings as the
        model is built and its memory is (re)built -- what predictions use from then on, so a
        ``set_params`` after ``fit`` does not change them (scikit-learn's convention;
        ``predict_topk``'s ``neighbours`` / ``rerank`` arguments choose per call)."""
        for name in ("neighbours", "neighbour_weight", "rerank"):
            value, problem = params_mod.check_value(params_mod.BY_NAME[name],
                                                    getattr(self, name))
            if problem:
                raise ValueError(f"{name} {problem}")
            setattr(self, name + "_", value)

    @staticmethod
    def _check_switches(neighbours, rerank):
        """``predict_topk``'s per-call ``neighbours`` / ``rerank`` (None: as fitted)."""
        for name, value in (("neighbours", neighbours), ("rerank", rerank)):
            if value is None:
                continue
            _, problem = params_mod.check_value(params_mod.BY_NAME[name], value)
            if problem:
                raise ValueError(f"{name} {problem}")

    def _check_eval_set(self, eval_set, X, Y):
        try:
            Xe, Ye = eval_set
        except (TypeError, ValueError):
            raise ValueError("eval_set must be a pair (X_val, Y_val)") from None
        Xe = as_feature_matrix(Xe, n_features=X.shape[1], name="eval_set X")
        Xe.indptr = Xe.indptr.astype(np.int64, copy=False)
        Ye = labels_mod.encode_known(Ye, self, n_rows=Xe.shape[0], name="eval_set Y")
        return Xe, Ye

    def __getstate__(self):
        """Pickling (joblib, multiprocessing, ``copy.deepcopy``): a fitted model travels as
        its checkpoint bytes (``slide.persist.pickling``; the compiled network's arrays do not
        pickle), an unfitted one as its keywords."""
        return pickling.getstate(self)

    def __setstate__(self, state):
        pickling.setstate(self, state)


# --------------------------------------------------------------------------------------------
# scikit-learn's parameter constraints

def _interval(p, number_type):
    left = p.gt if p.gt is not None else p.ge
    right = p.lt if p.lt is not None else p.le
    closed = {(True, True): "both", (True, False): "left", (False, True): "right",
              (False, False): "neither"}[(p.ge is not None, p.le is not None)]
    return Interval(number_type, left, right, closed=closed)


def sklearn_constraints(params=None) -> dict:
    """``_parameter_constraints`` (scikit-learn's declaration, read by its
    ``_validate_params`` and ``estimator_checks``) generated from the table's rows: kinds,
    bounds and choices become ``Interval`` / ``StrOptions`` / ``"boolean"`` / ``None``. The
    table's own check (``check_estimator_params``) stays the stricter one (bools are not
    integers, floats must be finite) and the one whose messages the user reads."""
    out = {}
    for p in params_mod.ESTIMATOR_PARAMS if params is None else params:
        kind = p.kind
        allowed = []
        if kind.endswith("_or_none") or kind == "layers":
            allowed.append(None)
            kind = kind[:-len("_or_none")] if kind.endswith("_or_none") else kind
        if kind == "int_or_auto":
            allowed.append(StrOptions({"auto"}))
            kind = "int"
        if kind == "int_list_or_auto":
            allowed.append(StrOptions({"auto"}))
            kind = "int_list"
        if kind == "int_list":
            allowed += ["array-like", _interval(p, Integral)]
        elif kind == "layers":
            allowed.append("array-like")
        elif kind == "int":
            allowed.append(_interval(p, Integral))
        elif kind == "float":
            allowed.append(_interval(p, Real))
        elif kind == "bool":
            allowed.append("boolean")
        elif kind == "str":
            allowed.append(StrOptions(set(p.choices)) if p.choices else str)
        elif kind == "table":
            allowed.append(dict)
        out[p.name] = allowed
    return out
