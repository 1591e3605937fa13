"""PyTorch-CPU baseline: the same dense network as the TensorFlow one.

Sparse CSR input (``torch.sparse_csr_tensor``) -> ``torch.sparse.mm`` with W0 [features, 128]
(+ bias, ReLU) -> logits = h @ W1 + b1 over all labels -> ``F.cross_entropy`` against the
per-batch probability target with 1/|y| on each true label (the same loss as slide and the TF
baseline; the dense target exists for one batch at a time only). Adam (``torch.optim.Adam``,
the fused CPU kernel when this PyTorch has it) over every parameter every batch. Starts from the
same NumPy-drawn initial weights as the TF baseline (``bench.common.init_dense_weights``).
"""
from __future__ import annotations

import math
import time

import numpy as np

from bench.common import EvalSchedule, Recorder, batch_order, evaluate_topk, \
    init_dense_weights, label_targets, predict_in_blocks


def _import_torch(threads):
    import torch
    torch.set_num_threads(int(threads))
    try:
        torch.set_num_interop_threads(int(threads))
    except RuntimeError:  # already fixed by earlier parallel work in this process
        pass
    return torch


class _TorchModel:
    def __init__(self, torch, n_features, n_labels, hidden, lr, init, seed,
                 betas=(0.9, 0.999), eps=1e-8, label_counts=None, n_train=None):
        self.torch = torch
        self.F, self.L = n_features, n_labels
        torch.manual_seed(int(seed))
        W0, b0, W1, b1 = init_dense_weights(n_features, hidden, n_labels, init, seed,
                                            label_counts, n_train)
        P = torch.nn.Parameter
        self.W0, self.b0 = P(torch.from_numpy(W0)), P(torch.from_numpy(b0))
        self.W1, self.b1 = P(torch.from_numpy(W1)), P(torch.from_numpy(b1))
        self.params = [self.W0, self.b0, self.W1, self.b1]
        self.fused = True
        try:
            self.opt = torch.optim.Adam(self.params, lr=lr, betas=betas, eps=eps, fused=True)
        except (RuntimeError, TypeError, ValueError):
            self.fused = False
            self.opt = torch.optim.Adam(self.params, lr=lr, betas=betas, eps=eps, foreach=True)

    def _x(self, X):
        t = self.torch
        return t.sparse_csr_tensor(t.from_numpy(X.indptr.astype(np.int64)),
                                   t.from_numpy(X.indices.astype(np.int64)),
                                   t.from_numpy(X.data.astype(np.float32)),
                                   size=(X.shape[0], self.F))

    def _logits(self, X):
        t = self.torch
        h = t.relu(t.sparse.mm(self._x(X), self.W0) + self.b0)
        return t.addmm(self.b1, h, self.W1)

    def train_batch(self, X, Y):
        t = self.torch
        rows, labels, w = label_targets(Y)
        logits = self._logits(X)
        target = t.zeros((X.shape[0], self.L), dtype=t.float32)
        target[t.from_numpy(rows), t.from_numpy(labels)] = t.from_numpy(w)
        loss = t.nn.functional.cross_entropy(logits, target)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return float(loss.detach())

    def predict_topk(self, X, k=5):
        t = self.torch

        def block(Xb):
            with t.no_grad():
                return t.topk(self._logits(Xb), k, dim=1).indices.numpy()
        return predict_in_blocks(block, X, k, self.L)


def run(spec, meta, X_tr, Y_tr, X_te, Y_te, X_ev, Y_ev, threads):
    torch = _import_torch(threads)
    model = _TorchModel(torch, meta["n_features"], meta["n_labels"], spec["hidden"], spec["lr"],
                        spec["init"], spec["seed"],
                        label_counts=np.bincount(Y_tr.indices, minlength=meta["n_labels"]),
                        n_train=X_tr.shape[0])
    bs = int(spec["batch_size"])
    bpe = math.ceil(X_tr.shape[0] / bs)
    sched = EvalSchedule(bpe, spec.get("eval_every_batches"), spec.get("eval_every_seconds"),
                         spec.get("evals_per_epoch"))
    rec = Recorder(sched, X_ev if spec.get("n_eval", 1) else None, Y_ev, model.predict_topk,
                   X_tr.shape[0], bs, spec.get("max_batches"))
    train_s = 0.0
    stop = False
    for epoch in range(int(spec["epochs"])):
        batches = list(batch_order(X_tr.shape[0], bs, spec["seed"], epoch))
        for i, ids in enumerate(batches):
            t = time.perf_counter()
            loss = model.train_batch(X_tr[ids], Y_tr[ids])
            train_s += time.perf_counter() - t
            if not math.isfinite(loss):
                raise FloatingPointError(f"non-finite loss at epoch {epoch} batch {i}")
            last = epoch == spec["epochs"] - 1 and i == len(batches) - 1
            if rec.after_batch(train_s, loss, epoch, last):
                stop = True
                break
        if stop:
            break
    final = None
    if spec.get("final_eval", True):
        t = time.perf_counter()
        final = evaluate_topk(Y_te, model.predict_topk(X_te))
        final["eval_seconds"] = time.perf_counter() - t
    extra = {"framework": f"torch {torch.__version__}", "fused_adam": model.fused,
             "n_params": int(sum(p.numel() for p in model.params)),
             "torch_threads": torch.get_num_threads(),
             "torch_interop_threads": torch.get_num_interop_threads()}
    return rec, final, extra
