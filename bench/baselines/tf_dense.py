"""TensorFlow-CPU baselines: the SLIDE paper's dense model and TF's sampled softmax.

Network (both): sparse input (``tf.sparse.SparseTensor``) -> Dense(128) ReLU -> logits over all
labels. Training step compiled as one ``tf.function`` graph.

* ``tf`` (full softmax): loss = softmax cross-entropy against the per-batch target with 1/|y| on
  each true label (``tf.nn.softmax_cross_entropy_with_logits``; the target is scattered into a
  dense [batch, labels] tensor per batch only, never for the whole set).
* ``tf_sampled``: ``tf.nn.sampled_softmax_loss``. It handles ``num_true`` true classes per row
  only with a fixed ``num_true`` (padding would duplicate true logits in its softmax), so a
  multi-label point is expanded into one row per true label (``num_true=1``), each row weighted
  1/|y|: for a full softmax this equals the 1/|y|-target cross-entropy exactly
  (-sum_j (1/|y|) log p_j), and the sampled version estimates it. The hidden layer is computed
  once per point and gathered for the replicas. Negatives: ``num_sampled`` classes per batch,
  shared by its rows; ``remove_accidental_hits`` drops a row's own label from them.

Optimiser: Adam through TF's fused ``ResourceApplyAdam`` kernel (the TF1 ``AdamOptimizer`` update
the SLIDE paper's baseline ran; bias correction folded into the step size), on every variable
every batch — the dense baseline. For the sampled loss the output-layer gradient is
``IndexedSlices``; TF's own Adam decays the moments of the whole matrix every step anyway, so it
is densified and goes through the same kernel (identical update).
"""
from __future__ import annotations

import math
import time

import numpy as np

from bench.common import EvalSchedule, Recorder, batch_order, evaluate_topk, \
    init_dense_weights, label_targets, predict_in_blocks


def _import_tf(threads):
    """Import TensorFlow and fix its thread pools before any op runs (they cannot change later)."""
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(int(threads))
    tf.config.threading.set_inter_op_parallelism_threads(int(threads))
    return tf


class _TFModel:
    def __init__(self, tf, n_features, n_labels, hidden, lr, init, seed, sampled=None,
                 beta1=0.9, beta2=0.999, epsilon=1e-8, label_counts=None, n_train=None):
        self.tf = tf
        self.F, self.L, self.H = n_features, n_labels, hidden
        W0, b0, W1, b1 = init_dense_weights(n_features, hidden, n_labels, init, seed,
                                            label_counts, n_train)
        tf.random.set_seed(int(seed))
        self.sampled = sampled
        # the unigram sampler draws negatives in proportion to (training count + 1), the
        # distribution of slide's shared negatives (sampler.negative_power = 1)
        self.unigrams = None if label_counts is None else \
            (np.asarray(label_counts, np.float64) + 1.0).tolist()
        self.W0 = tf.Variable(W0, name="W0")
        self.b0 = tf.Variable(b0, name="b0")
        # sampled_softmax_loss wants the output weights as [n_labels, hidden]
        self.W1 = tf.Variable(np.ascontiguousarray(W1.T) if sampled else W1, name="W1")
        self.b1 = tf.Variable(b1, name="b1")
        del W0, W1
        self.vars = [self.W0, self.b0, self.W1, self.b1]
        self.m = [tf.Variable(tf.zeros_like(v)) for v in self.vars]
        self.v = [tf.Variable(tf.zeros_like(v)) for v in self.vars]
        self.b1p = tf.Variable(1.0, dtype=tf.float32)
        self.b2p = tf.Variable(1.0, dtype=tf.float32)
        self.lr = tf.constant(lr, tf.float32)
        self.beta1 = tf.constant(beta1, tf.float32)
        self.beta2 = tf.constant(beta2, tf.float32)
        self.eps = tf.constant(epsilon, tf.float32)
        spec = [tf.TensorSpec([None, 2], tf.int64), tf.TensorSpec([None], tf.float32),
                tf.TensorSpec([], tf.int64), tf.TensorSpec([None], tf.int64),
                tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.float32)]
        self.train_step = tf.function(self._step, input_signature=spec)
        self.topk_step = tf.function(self._topk, input_signature=spec[:3] + [
            tf.TensorSpec([], tf.int32)])

    def _hidden(self, idx, vals, bsz):
        tf = self.tf
        x = tf.sparse.SparseTensor(idx, vals, tf.stack([bsz, self.F]))
        return tf.nn.relu(tf.sparse.sparse_dense_matmul(x, self.W0) + self.b0)

    def _logits(self, h):
        if self.sampled:
            return self.tf.matmul(h, self.W1, transpose_b=True) + self.b1
        return self.tf.matmul(h, self.W1) + self.b1

    def _step(self, idx, vals, bsz, rows, labels, weights):
        tf = self.tf
        with tf.GradientTape() as tape:
            h = self._hidden(idx, vals, bsz)
            if self.sampled:
                per_row = tf.nn.sampled_softmax_loss(
                    weights=self.W1, biases=self.b1, labels=tf.expand_dims(labels, 1),
                    inputs=tf.gather(h, rows), num_sampled=self.sampled["num_sampled"],
                    num_classes=self.L, num_true=1, sampled_values=self._candidates(labels),
                    remove_accidental_hits=True)
                loss = tf.reduce_sum(per_row * weights) / tf.cast(bsz, tf.float32)
            else:
                logits = self._logits(h)
                target = tf.scatter_nd(tf.stack([rows, labels], 1), weights,
                                       tf.stack([bsz, tf.constant(self.L, tf.int64)]))
                loss = tf.reduce_mean(
                    tf.nn.softmax_cross_entropy_with_logits(labels=target, logits=logits))
        grads = tape.gradient(loss, self.vars)
        self.b1p.assign(self.b1p * self.beta1)
        self.b2p.assign(self.b2p * self.beta2)
        for var, g, m, v in zip(self.vars, grads, self.m, self.v):
            if isinstance(g, tf.IndexedSlices):
                g = tf.convert_to_tensor(g)
            tf.raw_ops.ResourceApplyAdam(var=var.handle, m=m.handle, v=v.handle,
                                         beta1_power=self.b1p, beta2_power=self.b2p,
                                         lr=self.lr, beta1=self.beta1, beta2=self.beta2,
                                         epsilon=self.eps, grad=g, use_locking=False)
        return loss

    def _candidates(self, labels):
        tf = self.tf
        s = self.sampled
        true = tf.expand_dims(labels, 1)
        if s["sampler"] == "uniform":
            return tf.random.uniform_candidate_sampler(true, 1, s["num_sampled"], True, self.L)
        if s["sampler"] == "log_uniform":
            return tf.random.log_uniform_candidate_sampler(true, 1, s["num_sampled"], True,
                                                           self.L)
        if s["sampler"] == "unigram":
            return tf.random.fixed_unigram_candidate_sampler(
                true, 1, s["num_sampled"], True, self.L, unigrams=self.unigrams)
        raise ValueError(f"unknown candidate sampler {s['sampler']!r}")

    def _topk(self, idx, vals, bsz, k):
        return self.tf.math.top_k(self._logits(self._hidden(idx, vals, bsz)), k=k).indices

    # -- numpy-facing helpers
    @staticmethod
    def _sparse_args(X):
        X = X.tocoo()
        idx = np.stack([X.row, X.col], 1).astype(np.int64)
        return idx, X.data.astype(np.float32), np.int64(X.shape[0])

    def train_batch(self, X, Y):
        idx, vals, bsz = self._sparse_args(X)
        rows, labels, w = label_targets(Y)
        return float(self.train_step(idx, vals, bsz, rows, labels, w))

    def predict_topk(self, X, k=5):
        def block(Xb):
            idx, vals, bsz = self._sparse_args(Xb)
            return self.topk_step(idx, vals, bsz, np.int32(k)).numpy()
        return predict_in_blocks(block, X, k, self.L)


def _train(spec, meta, X_tr, Y_tr, X_te, Y_te, X_ev, Y_ev, threads, sampled):
    tf = _import_tf(threads)
    model = _TFModel(tf, meta["n_features"], meta["n_labels"], spec["hidden"], spec["lr"],
                     spec["init"], spec["seed"], sampled=sampled,
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
            loss = model.train_batch(X_tr[ids], Y_tr[ids])  # float() syncs: the step is done
            train_s += time.perf_counter() - t
            last = epoch == spec["epochs"] - 1 and i == len(batches) - 1
            if not math.isfinite(loss):
                raise FloatingPointError(f"non-finite loss at epoch {epoch} batch {i}")
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
    extra = {"framework": f"tensorflow {tf.__version__}",
             "n_params": int(sum(int(np.prod(v.shape)) for v in model.vars)),
             "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
             "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads()}
    if sampled:
        extra["num_sampled"] = sampled["num_sampled"]
        extra["candidate_sampler"] = sampled["sampler"]
    return rec, final, extra


def run_dense(spec, meta, X_tr, Y_tr, X_te, Y_te, X_ev, Y_ev, threads):
    return _train(spec, meta, X_tr, Y_tr, X_te, Y_te, X_ev, Y_ev, threads, None)


def run_sampled(spec, meta, X_tr, Y_tr, X_te, Y_te, X_ev, Y_ev, threads):
    sampled = {"num_sampled": int(spec["num_sampled"]),
               "sampler": spec.get("candidate_sampler", "uniform")}
    return _train(spec, meta, X_tr, Y_tr, X_te, Y_te, X_ev, Y_ev, threads, sampled)
