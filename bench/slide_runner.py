"""slide inside the benchmark harness: the engine's own ``SlideClassifier.fit`` with a callback.

The callback runs after every batch: it stamps the batch's end (training seconds = wall time since
``fit`` was called, minus the evaluations done so far, so hash-table construction and every
rehash count as training) and evaluates on the shared evaluation sample when due, with exact
top-k over all labels (``predict_topk(X, k=5, exact=True)``), the same metric code as the
baselines. Evaluation time is excluded from training seconds.
"""
from __future__ import annotations

import inspect
import math
import time

import numpy as np
import scipy.sparse as sp

from bench.common import EvalSchedule, Recorder, final_evaluation


def _estimator_class():
    from slide import SlideClassifier
    return SlideClassifier


def make_params(spec, threads):
    """Keyword arguments of SlideClassifier: the shared settings plus the slide-only flags."""
    params = dict(spec.get("slide_params") or {})
    # the TensorFlow / PyTorch baselines predict with their network alone, so slide does too:
    # network against network (the neighbour vote, slide.rank.vote, would work on their hidden
    # layers as well); slide_params {"neighbours": 20} opts in
    params.setdefault("neighbours", 0)
    params.update(hidden_sizes=(int(spec["hidden"]),), learning_rate=float(spec["lr"]),
                  batch_size=int(spec["batch_size"]), epochs=int(spec["epochs"]),
                  n_threads=int(threads), random_state=int(spec["seed"]))
    # the variants are the same estimator with one sampler forced (the default is "random")
    forced = {"slide_dense": "dense", "slide_lsh": "vanilla"}.get(spec["system"])
    if forced is not None:
        params["sampler"] = forced
    known = inspect.signature(_estimator_class().__init__).parameters
    unknown = sorted(k for k in params if k not in known)
    if unknown:
        raise ValueError(f"SlideClassifier has no parameter(s) {unknown}; it takes "
                         f"{sorted(k for k in known if k != 'self')}")
    return params


def _warm_up(params):
    """Compile (or load from Numba's cache) every kernel one fit uses, on a throw-away tiny
    problem with the same hyperparameters, so one-time compilation is not timed as training."""
    rng = np.random.default_rng(0)
    n, F, L = 512, 2000, 4000
    X = sp.random(n, F, density=0.02, format="csr", dtype=np.float32, random_state=rng)
    X.data[:] = 1.0
    labels = rng.integers(0, L, size=(n, 2))
    Y = sp.csr_matrix((np.ones(2 * n, np.float32), labels.ravel(), np.arange(0, 2 * n + 1, 2)),
                      shape=(n, L))
    Y.sum_duplicates()
    Y.data[:] = 1.0
    p = dict(params, epochs=1)
    t = time.perf_counter()
    clf = _estimator_class()(**p)
    clf.fit(X, Y, callback=lambda model, info: info["batch"] >= 3)
    clf.predict_topk(X[:64], k=5, exact=True)
    return time.perf_counter() - t


def run(spec, meta, X_tr, Y_tr, X_te, Y_te, X_ev, Y_ev, threads):
    import numba
    params = make_params(spec, threads)
    warm = None
    warm_error = None
    if spec.get("warmup", True):
        try:
            warm = _warm_up(params)
        except Exception as e:  # noqa: BLE001 - a failed warm-up only means compile is timed
            warm_error = f"{type(e).__name__}: {e}"
            print(f"  [slide] warm-up failed ({warm_error}); compilation will be timed", flush=True)
    clf = _estimator_class()(**params)
    bs = int(spec["batch_size"])
    bpe = math.ceil(X_tr.shape[0] / bs)
    sched = EvalSchedule(bpe, spec.get("eval_every_batches"), spec.get("eval_every_seconds"),
                         spec.get("evals_per_epoch"))

    def predict(X):
        return np.asarray(clf_ref[0].predict_topk(X, k=5, exact=True))

    clf_ref = [clf]
    rec = Recorder(sched, X_ev if spec.get("n_eval", 1) else None, Y_ev, predict,
                   X_tr.shape[0], bs, spec.get("max_batches"))
    total_batches = bpe * int(spec["epochs"])
    active, infos = [], {"rehashed": 0, "rebuilt": 0}
    state = {"t0": None}

    def callback(model, info):
        now = time.perf_counter()
        clf_ref[0] = model
        train_s = now - state["t0"] - rec.eval_seconds
        if info.get("active_mean") is not None:
            active.append(float(info["active_mean"]))
        for k in ("rehashed", "rebuilt"):
            infos[k] += int(bool(info.get(k)))
        # with several batches in flight the callback comes once a wave of info["batches"]
        count = int(info.get("batches", 1))
        n = len(rec.batch_end) + count
        epoch = int(info.get("epoch", (n - 1) // bpe))
        return rec.after_batches(count, train_s, info.get("loss"), epoch,
                                 last=n >= total_batches)

    state["t0"] = time.perf_counter()
    clf.fit(X_tr, Y_tr, callback=callback)
    final = final_evaluation(spec, Y_tr, Y_te,
                             lambda X: np.asarray(clf.predict_topk(X, k=5, exact=True)), X_te)
    import slide
    extra = {"framework": f"slide {slide.__version__} (numba {numba.__version__})",
             "slide_params": {k: (list(v) if isinstance(v, tuple) else v)
                              for k, v in params.items()},
             "warmup_seconds": warm, "warmup_error": warm_error,
             "active_mean": float(np.mean(active)) if active else None,
             "rehashes": infos["rehashed"], "rebuilds": infos["rebuilt"],
             "numba_threads": numba.get_num_threads(),
             # TBB, OpenMP or workqueue: a machine without the tbb package falls back quietly
             "threading_layer": _threading_layer()}
    return rec, final, extra


def _threading_layer():
    """Numba's threading layer in this process (None before any parallel kernel ran)."""
    import numba
    try:
        return numba.threading_layer()
    except ValueError:
        return None
