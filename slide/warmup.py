"""Kernel compilation apart from training.

Numba compiles a kernel at its first call (or loads it from the on-disk cache, which also takes
seconds), and it specialises on argument *types*, never on sizes. ``warm_up(model)`` therefore
trains a tiny throw-away copy of ``model`` -- the same hyperparameters and code paths (sampler,
hash family, loss, optimizer, depth, sparse layers, dense mode), tiny sizes -- on a tiny
synthetic batch set, with a rehash and a rebuild of its tables, an epoch-end sync and an exact
evaluation, so that every kernel the real run will call is compiled before its clock starts.
It runs once per process and configuration; the seconds it took are what ``SlideClassifier``
reports as ``compile_seconds_``, never as training time.
"""
import sys
import time

import numpy as np
import scipy.sparse as sp
from numba.core.registry import CPUDispatcher

from slide import metrics
from slide.rank.linear import LabelLinear, OneVsRest, strongest_terms


# configurations already warmed in this process: key -> seconds the warm-up took
_WARMED = {}

# the tiny copy's sizes: big enough for every hash family (WTA/DWTA need >= 8 inputs) and to
# give every batch a partial last batch and more than one label per sample
_TINY_FEATURES = 64
_TINY_LABELS = 96
_TINY_POINTS = 40
_TINY_BATCH = 16
_TINY_HIDDEN = 16
_TINY_TABLES = 2


def config_key(model):
    """What decides which kernels (and which type signatures) a fit of ``model`` compiles: the
    code paths, never the sizes, rates or seeds."""
    p = model.get_params(deep=False)
    sparse = p["sparse_layers"]
    return (len(tuple(p["hidden_sizes"])), p["sampler"], p["hash_family"], p["loss"],
            p["optimizer"], p["bucket_policy"], p["output_bias_init"],
            bool(p["sampling_correction"]), float(p["negative_power"]) > 0.0,
            bool(p.get("rerank", False)) and int(p.get("neighbours", 0)) > 0,
            int(p["shared_negatives"]) > 0, int(p["min_active"]) > 0, p.get("engine"),
            None if sparse is None else tuple(sorted(int(layer) for layer in sparse)))


def is_warm(model):
    """True when ``model``'s configuration was already warmed up in this process."""
    return config_key(model) in _WARMED


def tiny_data(seed=0):
    """A tiny synthetic multi-label set in the canonical CSR form (float32 values, int32
    indices), every row with 1 to 4 nonzeros and 1 to 3 labels."""
    rng = np.random.default_rng(seed)
    x_rows, y_rows = [], []
    for _ in range(_TINY_POINTS):
        x_rows.append(np.sort(rng.choice(_TINY_FEATURES, rng.integers(1, 5), replace=False)))
        y_rows.append(np.sort(rng.choice(_TINY_LABELS, rng.integers(1, 4), replace=False)))

    def csr(rows, n_cols):
        indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int32)
        indices = np.concatenate(rows).astype(np.int32)
        data = np.ones(len(indices), np.float32)
        return sp.csr_matrix((data, indices, indptr), shape=(len(rows), n_cols))

    X = csr(x_rows, _TINY_FEATURES)
    X.data = rng.uniform(0.1, 1.0, X.nnz).astype(np.float32)
    return X, csr(y_rows, _TINY_LABELS)


def tiny_copy(model):
    """A throw-away estimator with ``model``'s code paths at tiny sizes; its schedule rehashes
    after the first batch and rebuilds after the second, so both run in the warm-up."""
    p = model.get_params(deep=False)
    p.update(hidden_sizes=tuple(min(int(h), _TINY_HIDDEN) for h in p["hidden_sizes"]),
             L=min(int(p["L"]), _TINY_TABLES), batch_size=_TINY_BATCH, epochs=1,
             rehash_period=1, rebuild_period=2, rehash_decay=0.0,
             sampler_budget=min(int(p["sampler_budget"]), 32),
             shared_negatives=min(int(p["shared_negatives"]), 8),
             min_active=min(int(p["min_active"]), 24), random_state=0, verbose=0,
             time_budget=None)
    return type(model)(**p)


def warm_up(model):
    """Compile (or load from Numba's cache) every kernel a fit of ``model`` will call, unless
    this process already did for its configuration. Returns the seconds spent here (0.0 when
    already warm). ``model``'s hyperparameters must be valid (``fit`` checks them first)."""
    key = config_key(model)
    if key in _WARMED:
        return 0.0
    t0 = time.perf_counter()
    X, Y = tiny_data()
    copy = tiny_copy(model)
    copy._rerank_min_holdout = 1        # the tiny set's held-out rows fit the re-ranker too
    copy._fit_core(X, Y, eval_set=None, callback=None, resume=False)
    if copy.rank_.reranker is not None:
        _warm_linear(copy, X, Y)
    # the evaluation the CLI runs during training (exact top-k, then P@k / nDCG@k / PSP@k)
    top = copy.predict_topk(X, k=5)
    metrics.evaluate(Y, top, ks=(1, 3, 5),
                     inv_propensity=metrics.inverse_propensity(Y, 0.55, 1.5))
    seconds = time.perf_counter() - t0
    _WARMED[key] = seconds
    return seconds


def _warm_linear(model, X, Y):
    """Both kinds of the re-ranker's linear classifiers, fitted and scored on the tiny set:
    which one a fit trains depends on the data's sizes (``label_linear.fit_classifiers``)."""
    strongest_terms(X, 1)           # the cut of long rows (no tiny row is longer than 128)
    rows = np.arange(X.shape[0], dtype=np.int64)
    ptr = np.arange(X.shape[0] + 1, dtype=np.int64)
    counts = np.ones(X.shape[0], np.int64)
    ids = Y.indices[Y.indptr[:-1]].astype(np.int64)         # each row's first label
    F = np.zeros((X.shape[0], 1))
    H = model.network_.hidden(X)
    for fitted in (LabelLinear.fit(model._output(), H, X, Y, rows), OneVsRest.fit(X, Y, rows)):
        fitted.score_into(X, ptr, counts, ids, F, 0)


def kernel_signatures():
    """``{"module.function": number of compiled type signatures}`` over every Numba dispatcher
    of the loaded ``slide`` modules: a fit that compiles nothing new leaves it unchanged."""
    out = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "slide" or name.startswith("slide.")):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, CPUDispatcher) and value.__module__ == name:
                out[f"{name}.{attr}"] = len(value.signatures)
    return out
