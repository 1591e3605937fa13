"""The timed training loop of the dense baselines (TensorFlow and PyTorch), written once.

A baseline supplies only its model: an object with

* ``train_batch(X, Y) -> float``: one optimiser step on a CSR batch; returns the loss as a
  Python float (which waits for the step to finish, so the clock is honest);
* ``predict_topk(X, k=5) -> int[n, k]``;
* ``reset()``: put weights and optimiser state back to the initial ones;
* ``describe() -> dict``: framework, parameter count, thread settings (merged into the result).

Before the clock starts the loop runs one training step on the first batch of epoch 0 and one
prediction, then calls ``reset()``: graph tracing (``tf.function``), kernel selection and first-
touch allocation are excluded, as Numba compilation is excluded for slide, and the timed run
starts from exactly the initial weights. Training seconds are the sum of the batch steps
(slicing the batch out of the training CSR included, as slide's ``fit`` gathers its batches
inside its clock); evaluations lie outside them.
"""
from __future__ import annotations

import math
import time

from bench.common import EvalSchedule, Recorder, batch_order, final_evaluation


def warm_up(model, X_tr, Y_tr, batch_size, seed):
    """One step and one prediction on the first batch, then ``model.reset()``; seconds taken."""
    t = time.perf_counter()
    ids = next(iter(batch_order(X_tr.shape[0], batch_size, seed, 0)))
    model.train_batch(X_tr[ids], Y_tr[ids])
    model.predict_topk(X_tr[ids[:16]])
    model.reset()
    return time.perf_counter() - t


def train(spec, X_tr, Y_tr, X_te, Y_te, X_ev, Y_ev, model):
    """Train ``model`` for ``spec['epochs']`` epochs in slide's batch order, evaluating on the
    shared sample when due; returns (Recorder, final metrics, extra result fields)."""
    bs = int(spec["batch_size"])
    warm_s = warm_up(model, X_tr, Y_tr, bs, spec["seed"]) if spec.get("warmup", True) else None
    bpe = math.ceil(X_tr.shape[0] / bs)
    sched = EvalSchedule(bpe, spec.get("eval_every_batches"), spec.get("eval_every_seconds"),
                         spec.get("evals_per_epoch"))
    rec = Recorder(sched, X_ev if spec.get("n_eval", 1) else None, Y_ev, model.predict_topk,
                   X_tr.shape[0], bs, spec.get("max_batches"))
    train_s = 0.0
    epochs = int(spec["epochs"])
    for epoch in range(epochs):
        batches = list(batch_order(X_tr.shape[0], bs, spec["seed"], epoch))
        for i, ids in enumerate(batches):
            t = time.perf_counter()
            loss = model.train_batch(X_tr[ids], Y_tr[ids])  # slicing counts, as in slide's fit
            train_s += time.perf_counter() - t
            if not math.isfinite(loss):
                raise FloatingPointError(f"non-finite loss at epoch {epoch} batch {i}")
            last = epoch == epochs - 1 and i == len(batches) - 1
            if rec.after_batch(train_s, loss, epoch, last):
                return _finish(spec, rec, Y_tr, X_te, Y_te, model, warm_s)
    return _finish(spec, rec, Y_tr, X_te, Y_te, model, warm_s)


def _finish(spec, rec, Y_tr, X_te, Y_te, model, warm_s):
    final = final_evaluation(spec, Y_tr, Y_te, model.predict_topk, X_te)
    extra = dict(model.describe())
    extra["warmup_seconds"] = warm_s
    return rec, final, extra
