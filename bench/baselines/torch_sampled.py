"""PyTorch sampled softmax: what ``tf.nn.sampled_softmax_loss`` computes, for machines without
TensorFlow (the lent 16-core machine has PyTorch only).

The network, initial weights, targets and timed loop are those of ``bench/baselines/tf_dense.py``'s
``tf_sampled`` (read its docstring): sparse input through ``nn.EmbeddingBag(sparse=True)`` -> +b0,
ReLU -> per row of the target, the logit of its true label and of the batch's shared negatives.

* Negatives (:class:`UnigramCandidates`): ``num_sampled`` distinct labels per batch, drawn as TF's
  ``fixed_unigram_candidate_sampler(unique=True)`` draws them -- with replacement in proportion
  to (training count + 1) until that many distinct labels came up -- with TF's expected counts
  ``-expm1(tries * log1p(-p))``. With an exact head (``tf_head``), the most frequent labels are
  in every batch with expected count 1 and the draws come from the others.
* Logits minus log(expected count) (the logQ correction), a row's own label removed from its
  negatives (``remove_accidental_hits``), softmax cross-entropy with the true label at position
  0, rows weighted as the target says (``one``: one label drawn per point and step, weight 1;
  ``all``: a row per label, weight 1/|y|), summed and divided by the batch size.
* Output weights and biases are ``nn.Embedding(sparse=True)`` tables read with the batch's
  label ids, so their gradients are row-sparse; one ``torch.optim.SparseAdam`` steps the touched
  rows of the first layer and of the output layer (lazy Adam, as TF's baseline), and
  ``torch.optim.Adam`` the hidden bias.

The same ``torch_device`` option as ``torch_dense`` puts it on a GPU.
"""
from __future__ import annotations

import numpy as np

from bench import dense_loop
from bench.baselines.tf_dense import one_label_targets
from bench.baselines.torch_dense import (_import_torch, csr_tensors, optimiser_step,
                                         topk_of_logits)
from bench.common import init_dense_weights, label_targets


class UnigramCandidates:
    """The batch's shared negatives as TF's unique fixed-unigram sampler draws them.

    ``draw(rng)`` returns (labels int64[num_sampled], log expected counts float32[num_sampled]);
    ``log_expected(labels)`` the log expected counts of true labels for the last draw."""

    def __init__(self, label_counts, num_sampled, n_head=0):
        w = np.asarray(label_counts, np.float64) + 1.0
        n_labels = w.shape[0]
        self.head = np.zeros(0, np.int64)
        if n_head > 0:
            self.head = np.sort(np.argsort(-w, kind="stable")[:n_head]).astype(np.int64)
            w[self.head] = 0.0
        self.in_head = np.zeros(n_labels, np.bool_)
        self.in_head[self.head] = True
        self.p = w / w.sum()
        self.cdf = np.cumsum(self.p)
        self.cdf[-1] = np.inf    # rounding never draws past the last label
        self.n_draw = int(num_sampled) - self.head.shape[0]
        if self.n_draw < 0 or self.n_draw > int(np.count_nonzero(w)):
            raise ValueError(f"num_sampled={num_sampled} does not fit {n_head} head labels "
                             f"and {int(np.count_nonzero(w))} others")
        self.tries = 0

    def draw(self, rng):
        k = self.n_draw
        draws = np.zeros(0, np.int64)
        while True:
            more = np.searchsorted(self.cdf, rng.random(max(2 * k, 64)), side="right")
            draws = np.concatenate([draws, more])
            uniq, first = np.unique(draws, return_index=True)
            if uniq.shape[0] >= k:
                break
        order = np.sort(first)[:k]            # the first k distinct labels, in draw order
        self.tries = int(order[-1]) + 1 if k else 0
        labels = draws[order]
        log_exp = self._log_expected(labels)
        return (np.concatenate([self.head, labels]),
                np.concatenate([np.zeros(self.head.shape[0], np.float32), log_exp]))

    def _log_expected(self, labels):
        p = self.p[labels]
        k, tries = self.n_draw, self.tries
        if tries == k:
            exp = p * k
        else:
            exp = -np.expm1(tries * np.log1p(-np.minimum(p, 1.0 - 1e-12)))
        return np.log(np.maximum(exp, 1e-30)).astype(np.float32)

    def log_expected(self, labels):
        out = self._log_expected(labels)
        out[self.in_head[labels]] = 0.0
        return out


class _TorchSampledModel:
    def __init__(self, torch, n_features, n_labels, hidden, lr, init, seed, sampled,
                 label_counts, n_train, betas=(0.9, 0.999), eps=1e-8, device="cpu"):
        self.torch = torch
        self.device = torch.device(device)
        self.F, self.L = n_features, n_labels
        self.lr, self.betas, self.eps = lr, betas, eps
        self.sampled = sampled
        self.seed = int(seed)
        self.candidates = UnigramCandidates(label_counts, sampled["num_sampled"],
                                            sampled.get("head", 0))
        torch.manual_seed(self.seed)
        self._initial = lambda: init_dense_weights(n_features, hidden, n_labels, init, seed,
                                                   label_counts, n_train)
        dev = self.device
        W0, b0, W1, b1 = self._initial()
        nn = torch.nn
        self.emb = nn.EmbeddingBag(n_features, hidden, mode="sum", sparse=True,
                                   _weight=torch.from_numpy(W0)).to(dev)
        self.out_w = nn.Embedding(n_labels, hidden, sparse=True,
                                  _weight=torch.from_numpy(np.ascontiguousarray(W1.T))).to(dev)
        self.out_b = nn.Embedding(n_labels, 1, sparse=True,
                                  _weight=torch.from_numpy(b1.reshape(-1, 1))).to(dev)
        self.b0 = nn.Parameter(torch.from_numpy(b0).to(dev))
        self._make_optimisers()
        self._rngs()

    def _rngs(self):
        self.neg_rng = np.random.default_rng([self.seed, 11])
        self.target_rng = np.random.default_rng([self.seed, 7])

    def _make_optimisers(self):
        t = self.torch
        sparse = [self.emb.weight, self.out_w.weight, self.out_b.weight]
        self.sparse_opt = t.optim.SparseAdam(sparse, lr=self.lr, betas=self.betas, eps=self.eps)
        self.opt = t.optim.Adam([self.b0], lr=self.lr, betas=self.betas, eps=self.eps)

    def reset(self):
        W0, b0, W1, b1 = self._initial()
        with self.torch.no_grad():
            for p, arr in ((self.emb.weight, W0), (self.b0, b0),
                           (self.out_w.weight, np.ascontiguousarray(W1.T)),
                           (self.out_b.weight, b1.reshape(-1, 1))):
                p.copy_(self.torch.from_numpy(arr).to(self.device))
        self._make_optimisers()
        self._rngs()

    def describe(self):
        t = self.torch
        return {"framework": f"torch {t.__version__}", "torch_device": str(self.device),
                "sparse_adam_params": 3,
                "n_params": int(self.emb.weight.numel() + self.out_w.weight.numel()
                                + self.out_b.weight.numel() + self.b0.numel()),
                "torch_threads": t.get_num_threads(),
                "torch_interop_threads": t.get_num_interop_threads()}

    def _hidden(self, X):
        idx, off, val = csr_tensors(self.torch, X, self.device)
        return self.torch.relu(self.emb(idx, off, per_sample_weights=val) + self.b0)

    def batch_loss(self, X, rows, labels, weights, negatives, neg_log_exp):
        """The sampled softmax loss of one batch (a tensor; backward() gives the gradients)."""
        t, dev = self.torch, self.device
        F = t.nn.functional
        n = rows.shape[0]
        ids = t.from_numpy(np.concatenate([labels, negatives])).to(dev)
        w = F.embedding(ids, self.out_w.weight, sparse=True)
        b = F.embedding(ids, self.out_b.weight, sparse=True).squeeze(1)
        h = self._hidden(X)[t.from_numpy(rows).to(dev)]
        true_log_exp = t.from_numpy(self.candidates.log_expected(labels)).to(dev)
        true_logit = (h * w[:n]).sum(1) + b[:n] - true_log_exp
        neg_logit = t.addmm(b[n:], h, w[n:].t()) - t.from_numpy(neg_log_exp).to(dev)
        hits = ids[:n, None] == ids[None, n:]
        neg_logit = neg_logit.masked_fill(hits, float("-inf"))
        logits = t.cat([true_logit[:, None], neg_logit], 1)
        per_row = t.logsumexp(logits, 1) - true_logit
        return (per_row * t.from_numpy(weights).to(dev)).sum() / X.shape[0]

    def train_batch(self, X, Y):
        if self.sampled.get("target") == "one":
            rows, labels, w = one_label_targets(Y, self.target_rng)
        else:
            rows, labels, w = label_targets(Y)
        negatives, neg_log_exp = self.candidates.draw(self.neg_rng)
        loss = self.batch_loss(X, rows, labels, w, negatives, neg_log_exp)
        return optimiser_step(loss, (self.opt, self.sparse_opt))

    def _logits(self, X):
        """Every label's logit (prediction: no sampling)."""
        return self.torch.addmm(self.out_b.weight[:, 0], self._hidden(X), self.out_w.weight.t())

    def predict_topk(self, X, k=5):
        return topk_of_logits(self.torch, self._logits, X, k, self.L)


def run(spec, meta, X_tr, Y_tr, X_te, Y_te, X_ev, Y_ev, threads):
    torch = _import_torch(threads)
    sampled = {"num_sampled": int(spec["num_sampled"]),
               "target": spec.get("tf_target", "all"), "head": int(spec.get("tf_head", 0))}
    if spec.get("candidate_sampler", "unigram") != "unigram":
        raise ValueError("torch_sampled draws its negatives by label frequency only "
                         "(--candidate-sampler unigram)")
    model = _TorchSampledModel(torch, meta["n_features"], meta["n_labels"], spec["hidden"],
                               spec["lr"], spec["init"], spec["seed"], sampled,
                               np.bincount(Y_tr.indices, minlength=meta["n_labels"]),
                               X_tr.shape[0], device=spec.get("torch_device") or "cpu")
    rec, final, extra = dense_loop.train(spec, X_tr, Y_tr, X_te, Y_te, X_ev, Y_ev, model)
    extra.update(num_sampled=sampled["num_sampled"], candidate_sampler="unigram",
                 tf_target=sampled["target"], tf_head=sampled["head"])
    return rec, final, extra
