"""Label-tree baselines: Omikuji (Parabel-like and Bonsai-like) and napkinXC's PLT.

Both fit in one call on the whole training split (no batches, no epochs): their *training
seconds* are that call only (Omikuji: ``train_omikuji_model`` after its data set is loaded from
the XC file written for it, the loading timed apart as ``load_seconds``; napkinXC: ``PLT.fit``
on the in-memory CSR). The result has one curve point (after the fit, on the shared evaluation
sample) and the final P@k / PSP@k on the whole test split through the same ``slide.metrics`` code
and propensities as every other system. ``--threads`` goes to both (Omikuji's Rayon pool,
napkinXC's ``threads``).

* ``omikuji``: Omikuji's default hyper-parameters, its Parabel-like setting (balanced 2-means
  label tree, max depth 20, 3 trees, linear classifiers at each node).
* ``omikuji_bonsai``: the Bonsai-like setting of Omikuji's README (``--cluster.unbalanced
  --cluster.k 100 --max_depth 3``): wide, shallow, unbalanced trees.
* ``napkinxc``: ``napkinxc.models.PLT`` with its defaults (hierarchical k-means tree, arity 2,
  logistic loss, liblinear).
"""
from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import EvalSchedule, Recorder, final_evaluation

OMIKUJI_SETTINGS = {
    "omikuji": {},
    "omikuji_bonsai": {"cluster_k": 100, "max_depth": 3, "cluster_balanced": False},
}


def _recorder(spec, X_tr, X_ev, Y_ev, predict_topk):
    """A Recorder that sees the fit as a single 'batch' (evaluated right after it)."""
    bs = int(spec["batch_size"])
    sched = EvalSchedule(math.ceil(X_tr.shape[0] / bs), every_batches=1)
    return Recorder(sched, X_ev if spec.get("n_eval", 1) else None, Y_ev, predict_topk,
                    X_tr.shape[0], bs)


def _one_shot_fields(fit_seconds, n_train):
    """Result fields of a fit without batches (override the batch-based ones)."""
    return {"one_shot": True, "train_seconds": fit_seconds, "epoch_seconds": [fit_seconds],
            "samples": int(n_train), "n_batches": 1,
            "samples_per_second": n_train / fit_seconds if fit_seconds > 0 else None}


def _finish(spec, rec, fit_s, X_tr, Y_tr, X_te, Y_te, predict_topk, extra):
    rec.after_batch(fit_s, None, 0, last=True)
    final = final_evaluation(spec, Y_tr, Y_te, predict_topk, X_te)
    extra.update(_one_shot_fields(fit_s, X_tr.shape[0]))
    return rec, final, extra


# ----------------------------------------------------------------------------------- Omikuji

def _omikuji_fit(omikuji, train_path, hyper, threads):
    """(model, load seconds, fit seconds): the data set loaded, then the model trained, each
    timed (the two steps of ``Model.train_on_data``)."""
    try:
        lib, ffi = omikuji.lib, omikuji.ffi
        pool = omikuji._ThreadPoolHandle(int(threads))
        t = time.perf_counter()
        data = lib.load_omikuji_data_set(ffi.new("char[]", str(train_path).encode()), pool.ptr)
        if data == ffi.NULL:
            raise RuntimeError(f"omikuji failed to load {train_path}")
        data = ffi.gc(data, lib.free_omikuji_data_set)
        load_s = time.perf_counter() - t
        t = time.perf_counter()
        ptr = lib.train_omikuji_model(data, hyper, pool.ptr)
        fit_s = time.perf_counter() - t
        if ptr == ffi.NULL:
            raise RuntimeError("omikuji failed to train")
        return omikuji.Model(ptr), load_s, fit_s
    except AttributeError:   # another omikuji version: time the whole call (loading included)
        t = time.perf_counter()
        model = omikuji.Model.train_on_data(str(train_path), hyper, n_threads=int(threads))
        return model, 0.0, time.perf_counter() - t


def _omikuji_topk(model, X, k=5):
    out = np.zeros((X.shape[0], k), dtype=np.int64)
    for i in range(X.shape[0]):
        lo, hi = X.indptr[i], X.indptr[i + 1]
        pairs = list(zip(X.indices[lo:hi].tolist(), X.data[lo:hi].tolist()))
        pred = model.predict(pairs, top_k=k)
        labels = [lab for lab, _ in pred]
        # fewer than k predictions (a tiny tree): pad with a label not yet listed
        pad = [j for j in range(k + len(labels)) if j not in labels][:k - len(labels)]
        out[i] = labels + pad
    return out


def run_omikuji(spec, meta, X_tr, Y_tr, X_te, Y_te, X_ev, Y_ev, threads):
    import omikuji
    from slide.data import write_xc
    hyper = omikuji.Model.default_hyper_param()
    setting = OMIKUJI_SETTINGS[spec["system"]]
    for k, v in setting.items():
        setattr(hyper, k, v)
    with tempfile.TemporaryDirectory(prefix="omikuji-") as tmp:
        train_path = Path(tmp) / "train.txt"
        t = time.perf_counter()
        write_xc(train_path, X_tr, Y_tr)
        write_s = time.perf_counter() - t
        model, load_s, fit_s = _omikuji_fit(omikuji, train_path, hyper, threads)
    model.init_prediction_thread_pool(int(threads))
    predict = lambda X: _omikuji_topk(model, X)  # noqa: E731
    rec = _recorder(spec, X_tr, X_ev, Y_ev, predict)
    extra = {"framework": "omikuji", "write_seconds": write_s, "load_seconds": load_s,
             "hyper_params": {name: getattr(hyper, name) for name in dir(hyper)
                              if not name.startswith("_")
                              and isinstance(getattr(hyper, name), (int, float, bool))},
             "n_trees": int(model.n_trees)}
    return _finish(spec, rec, fit_s, X_tr, Y_tr, X_te, Y_te, predict, extra)


# ---------------------------------------------------------------------------------- napkinXC

def run_napkinxc(spec, meta, X_tr, Y_tr, X_te, Y_te, X_ev, Y_ev, threads):
    from napkinxc.models import PLT
    labels = np.split(Y_tr.indices.astype(np.int64), Y_tr.indptr[1:-1])
    with tempfile.TemporaryDirectory(prefix="napkinxc-") as tmp:
        model = PLT(str(Path(tmp) / "plt"), threads=int(threads), seed=int(spec["seed"]))
        t = time.perf_counter()
        model.fit(X_tr, [lab.tolist() for lab in labels])
        fit_s = time.perf_counter() - t

        def predict(X, k=5):
            out = np.zeros((X.shape[0], k), dtype=np.int64)
            for i, pred in enumerate(model.predict(X, top_k=k)):
                pred = [int(p[0]) if isinstance(p, tuple) else int(p) for p in pred][:k]
                pad = [j for j in range(2 * k) if j not in pred][:k - len(pred)]
                out[i] = pred + pad
            return out

        rec = _recorder(spec, X_tr, X_ev, Y_ev, predict)
        extra = {"framework": "napkinxc PLT", "plt_params": {"threads": int(threads),
                                                             "seed": int(spec["seed"])}}
        return _finish(spec, rec, fit_s, X_tr, Y_tr, X_te, Y_te, predict, extra)
