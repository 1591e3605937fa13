"""PyTorch baseline: the same network as the TensorFlow one, with slide's advantages.

First layer: ``nn.EmbeddingBag(n_features, hidden, mode="sum", sparse=True)`` fed the batch's CSR
(indices, offsets, ``per_sample_weights`` = the feature values), so its gradient is a sparse
tensor over the batch's features only and ``torch.optim.SparseAdam`` updates only those rows
(lazy Adam: untouched rows keep their moments and weights). Then + b0, ReLU -> logits = h @ W1 +
b1 over all labels -> ``F.cross_entropy`` against the per-batch probability target with 1/|y|
on each true label (the same loss as slide and the TF baseline; the dense target exists for one
batch at a time only). Hidden bias and output layer: ``torch.optim.Adam`` (fused CPU kernel when
this PyTorch has it); under the full softmax every output row has a gradient each batch anyway.
Starts from the same NumPy-drawn initial weights as the TF baseline
(``bench.common.init_dense_weights``; by default the output biases at slide's log label prior).
The timed loop is ``bench/dense_loop.py`` (one untimed step first, then :meth:`reset`).

``spec["torch_device"]`` (``bench/compare.py --torch-device``, default ``cpu``) puts the
parameters and every batch on another device, e.g. ``cuda`` for the dense GPU baseline; the loss
is read back as a Python float after each step, so the clock waits for the device.
"""
from __future__ import annotations

import numpy as np

from bench import dense_loop
from bench.common import init_dense_weights, label_targets, predict_in_blocks


def _import_torch(threads):
    import torch
    torch.set_num_threads(int(threads))
    try:
        torch.set_num_interop_threads(int(threads))
    except RuntimeError:  # already fixed by earlier parallel work in this process
        pass
    return torch


def csr_tensors(torch, X, device):
    """(indices, offsets, values) of a CSR batch as tensors on ``device``: EmbeddingBag's input."""
    return (torch.from_numpy(X.indices.astype(np.int64)).to(device),
            torch.from_numpy(X.indptr[:-1].astype(np.int64)).to(device),
            torch.from_numpy(X.data.astype(np.float32)).to(device))


def optimiser_step(loss, optimisers):
    """Zero the optimisers' gradients, backpropagate ``loss`` and step each in turn; returns the
    loss as a Python float (reading it waits for the device)."""
    for opt in optimisers:
        opt.zero_grad(set_to_none=True)
    loss.backward()
    for opt in optimisers:
        opt.step()
    return float(loss.detach())


def topk_of_logits(torch, logits, X, k, n_labels):
    """The ``k`` best labels of each row of X by ``logits(X block)``, in blocks, no gradients."""
    def block(Xb):
        with torch.no_grad():
            return torch.topk(logits(Xb), k, dim=1).indices.cpu().numpy()
    return predict_in_blocks(block, X, k, n_labels)


class _TorchModel:
    def __init__(self, torch, n_features, n_labels, hidden, lr, init, seed,
                 betas=(0.9, 0.999), eps=1e-8, label_counts=None, n_train=None, device="cpu"):
        self.torch = torch
        self.device = torch.device(device)
        self.F, self.L = n_features, n_labels
        self.lr, self.betas, self.eps = lr, betas, eps
        torch.manual_seed(int(seed))
        self._initial = lambda: init_dense_weights(n_features, hidden, n_labels, init, seed,
                                                   label_counts, n_train)
        W0, b0, W1, b1 = self._initial()
        dev = self.device
        self.emb = torch.nn.EmbeddingBag(n_features, hidden, mode="sum", sparse=True,
                                         _weight=torch.from_numpy(W0)).to(dev)
        P = torch.nn.Parameter
        self.b0 = P(torch.from_numpy(b0).to(dev))
        self.W1, self.b1 = P(torch.from_numpy(W1).to(dev)), P(torch.from_numpy(b1).to(dev))
        self.dense_params = [self.b0, self.W1, self.b1]
        self._make_optimisers()

    def _make_optimisers(self):
        t = self.torch
        self.sparse_opt = t.optim.SparseAdam([self.emb.weight], lr=self.lr, betas=self.betas,
                                             eps=self.eps)
        self.fused = True
        try:
            self.opt = t.optim.Adam(self.dense_params, lr=self.lr, betas=self.betas,
                                    eps=self.eps, fused=True)
        except (RuntimeError, TypeError, ValueError):
            self.fused = False
            self.opt = t.optim.Adam(self.dense_params, lr=self.lr, betas=self.betas,
                                    eps=self.eps, foreach=True)

    def reset(self):
        """Initial weights and fresh optimisers again (after the untimed warm-up step)."""
        W0, b0, W1, b1 = self._initial()
        with self.torch.no_grad():
            for p, arr in ((self.emb.weight, W0), (self.b0, b0), (self.W1, W1), (self.b1, b1)):
                p.copy_(self.torch.from_numpy(arr).to(self.device))
        self._make_optimisers()

    def describe(self):
        t = self.torch
        return {"framework": f"torch {t.__version__}", "fused_adam": self.fused,
                "torch_device": str(self.device),
                "sparse_adam_params": 1,
                "n_params": int(self.emb.weight.numel()
                                + sum(p.numel() for p in self.dense_params)),
                "torch_threads": t.get_num_threads(),
                "torch_interop_threads": t.get_num_interop_threads()}

    def _logits(self, X):
        t = self.torch
        idx, off, val = csr_tensors(t, X, self.device)
        h = self.emb(idx, off, per_sample_weights=val)
        return t.addmm(self.b1, t.relu(h + self.b0), self.W1)

    def train_batch(self, X, Y):
        t = self.torch
        rows, labels, w = label_targets(Y)
        logits = self._logits(X)
        target = t.zeros((X.shape[0], self.L), dtype=t.float32, device=self.device)
        target[t.from_numpy(rows).to(self.device), t.from_numpy(labels).to(self.device)] = \
            t.from_numpy(w).to(self.device)
        loss = t.nn.functional.cross_entropy(logits, target)
        return optimiser_step(loss, (self.opt, self.sparse_opt))

    def predict_topk(self, X, k=5):
        return topk_of_logits(self.torch, self._logits, X, k, self.L)


def run(spec, meta, X_tr, Y_tr, X_te, Y_te, X_ev, Y_ev, threads):
    torch = _import_torch(threads)
    model = _TorchModel(torch, meta["n_features"], meta["n_labels"], spec["hidden"], spec["lr"],
                        spec["init"], spec["seed"],
                        label_counts=np.bincount(Y_tr.indices, minlength=meta["n_labels"]),
                        n_train=X_tr.shape[0], device=spec.get("torch_device") or "cpu")
    return dense_loop.train(spec, X_tr, Y_tr, X_te, Y_te, X_ev, Y_ev, model)
