"""TensorFlow-CPU baselines: the SLIDE paper's dense model and TF's sampled softmax, each given
the advantages slide has.

Network (both): sparse input -> 128 ReLU -> logits over all labels. The first layer is a sparse
embedding lookup: ``tf.gather(W0, feature ids) * values`` summed per row
(``tf.math.unsorted_segment_sum``; what ``tf.nn.embedding_lookup_sparse(combiner="sum")`` does,
but keeping rows without features), so its gradient is ``IndexedSlices`` over the batch's
features only. Training step and prediction are ``tf.function`` graphs, traced and run once on a
throw-away batch before the clock starts (``bench/dense_loop.py``).

* ``tf`` (full softmax): loss = softmax cross-entropy against the per-batch target with 1/|y| on
  each true label (``tf.nn.softmax_cross_entropy_with_logits``; the target is scattered into a
  dense [batch, labels] tensor per batch only, never for the whole set).
* ``tf_sampled``: ``tf.nn.sampled_softmax_loss``. It handles ``num_true`` true classes per row
  only with a fixed ``num_true`` (padding would duplicate true logits in its softmax), so a
  multi-label point is expanded into one row per true label (``num_true=1``), each row weighted
  1/|y|: for a full softmax this equals the 1/|y|-target cross-entropy exactly
  (-sum_j (1/|y|) log p_j), and the sampled version estimates it. The hidden layer is computed
  once per point and gathered for the replicas. Negatives: ``num_sampled`` classes per batch,
  shared by its rows, drawn by ``--candidate-sampler`` (default ``unigram``: in proportion to
  training count + 1, slide's shared-negative distribution); ``remove_accidental_hits`` drops a
  row's own label from them. ``tf_target="one"`` (``--tf-target one``): one true label drawn
  uniformly per point and step (weight 1) instead of one row per label -- the stock TF recipe,
  cheaper on points with many labels; it estimates the same loss in expectation. ``tf_head``
  (``--tf-head``, by default the head slide's ``exact_head`` gives): that many of the most
  frequent labels are in every batch's negatives with expected count 1 (no logQ offset), and
  the other ``num_sampled - tf_head`` are drawn by the unigram sampler from the remaining
  labels -- the same exact head as slide's.

Initialisation: the same NumPy-drawn arrays as PyTorch (``bench.common.init_dense_weights``); by
default (``--init glorot_normal+log_prior``) the output biases start at slide's log label prior.

Optimiser: Adam (beta 0.9/0.999, eps 1e-8, bias correction folded into the step size, as TF's
fused ``ResourceApplyAdam``). Parameters whose gradient is ``IndexedSlices`` -- the first layer
always, the output layer's weights and biases under the sampled loss -- get a *row-sparse* Adam
(:meth:`_TFModel._sparse_adam`): duplicate rows summed, then m, v and the weights updated on
those rows only (``scatter_update``), untouched rows not moving (the "lazy Adam" of
``tfa.optimizers.LazyAdam`` and PyTorch's ``SparseAdam``). TF's own optimisers do *not* do this:
TF1's ``AdamOptimizer._apply_sparse`` decays the moments and moves every row of the variable each
step, and Keras 3's ``Adam`` densifies an ``IndexedSlices`` gradient (its ``m += (g - m)(1 -
beta1)`` subtracts a dense tensor) -- see bench/README.md for the check. Dense parameters (hidden
bias; the full-softmax output layer, whose every row has a gradient each batch anyway) go through
``ResourceApplyAdam``.
"""
from __future__ import annotations

import numpy as np

from bench import dense_loop
from bench.common import init_dense_weights, label_targets, predict_in_blocks


def one_label_targets(Y, rng):
    """(rows, labels, weights) with one true label per labelled row of the CSR batch ``Y``,
    drawn uniformly by ``rng``, weight 1."""
    counts = np.diff(Y.indptr)
    rows = np.flatnonzero(counts > 0)
    pick = Y.indptr[rows] + np.floor(rng.random(rows.shape[0]) * counts[rows]).astype(np.int64)
    return (rows.astype(np.int64), Y.indices[pick].astype(np.int64),
            np.ones(rows.shape[0], np.float32))


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
        self._initial = lambda: init_dense_weights(n_features, hidden, n_labels, init, seed,
                                                   label_counts, n_train)
        W0, b0, W1, b1 = self._initial()
        tf.random.set_seed(int(seed))
        self.sampled = sampled
        self._target_rng = np.random.default_rng([int(seed), 7])
        # the unigram sampler draws negatives in proportion to (training count + 1), the
        # distribution of slide's shared negatives (sampler.negative_power = 1)
        self.unigrams = None if label_counts is None else \
            (np.asarray(label_counts, np.float64) + 1.0).tolist()
        # the exact head (slide's exact_head): the most frequent labels are in every batch's
        # negatives with expected count 1 (no logQ offset); the other draws come from the
        # rest (their unigram weight made negligible for the head)
        self.head = None
        n_head = int((sampled or {}).get("head", 0))
        if n_head > 0 and label_counts is not None:
            counts = np.asarray(label_counts, np.float64)
            head = np.sort(np.argsort(-(counts + 1.0), kind="stable")[:n_head])
            tail = counts + 1.0
            tail[head] = 1e-30
            self.unigrams = tail.tolist()
            mask = np.zeros(n_labels, np.bool_)
            mask[head] = True
            self.head = tf.constant(head.astype(np.int64))
            self.head_mask = tf.constant(mask)
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
        spec = [tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.int64),
                tf.TensorSpec([None], tf.float32), tf.TensorSpec([], tf.int64),
                tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.int64),
                tf.TensorSpec([None], tf.float32)]
        self.train_step = tf.function(self._step, input_signature=spec)
        self.topk_step = tf.function(self._topk, input_signature=spec[:4] + [
            tf.TensorSpec([], tf.int32)])
        self.sparse_updates = 0   # parameters updated row-sparsely in the last step (a check)

    def reset(self):
        """Initial weights and zero optimiser state again (after the untimed warm-up step)."""
        W0, b0, W1, b1 = self._initial()
        for var, arr in zip(self.vars, (W0, b0, W1.T if self.sampled else W1, b1)):
            var.assign(np.ascontiguousarray(arr))
        for slot in self.m + self.v:
            slot.assign(self.tf.zeros_like(slot))
        self.b1p.assign(1.0)
        self.b2p.assign(1.0)

    def describe(self):
        tf = self.tf
        return {"framework": f"tensorflow {tf.__version__}",
                "n_params": int(sum(int(np.prod(v.shape)) for v in self.vars)),
                "sparse_adam_params": int(self.sparse_updates),
                "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
                "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads()}

    def _hidden(self, rows, cols, vals, bsz):
        """relu(x W0 + b0) as an embedding lookup: one W0 row per nonzero, scaled, summed per
        row; the gradient w.r.t. W0 is IndexedSlices over ``cols``."""
        tf = self.tf
        picked = tf.gather(self.W0, cols) * tf.expand_dims(vals, 1)
        return tf.nn.relu(tf.math.unsorted_segment_sum(picked, rows, bsz) + self.b0)

    def _logits(self, h):
        if self.sampled:
            return self.tf.matmul(h, self.W1, transpose_b=True) + self.b1
        return self.tf.matmul(h, self.W1) + self.b1

    def _step(self, x_rows, x_cols, x_vals, bsz, rows, labels, weights):
        tf = self.tf
        with tf.GradientTape() as tape:
            h = self._hidden(x_rows, x_cols, x_vals, bsz)
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
        n_sparse = 0
        for var, g, m, v in zip(self.vars, grads, self.m, self.v):
            if isinstance(g, tf.IndexedSlices):
                self._sparse_adam(var, m, v, g)
                n_sparse += 1
            else:
                tf.raw_ops.ResourceApplyAdam(var=var.handle, m=m.handle, v=v.handle,
                                             beta1_power=self.b1p, beta2_power=self.b2p,
                                             lr=self.lr, beta1=self.beta1, beta2=self.beta2,
                                             epsilon=self.eps, grad=g, use_locking=False)
        self.sparse_updates = n_sparse   # set at tracing time: a Python int, not a tensor
        return loss

    def _sparse_adam(self, var, m, v, g):
        """Adam on the rows ``g`` touches only (lazy Adam): duplicates summed first; the step
        size carries the bias correction, as ResourceApplyAdam's does."""
        tf = self.tf
        rows, pos = tf.unique(g.indices)
        grad = tf.math.unsorted_segment_sum(g.values, pos, tf.size(rows))
        m_rows = self.beta1 * tf.gather(m, rows) + (1.0 - self.beta1) * grad
        v_rows = self.beta2 * tf.gather(v, rows) + (1.0 - self.beta2) * tf.square(grad)
        step = self.lr * tf.sqrt(1.0 - self.b2p) / (1.0 - self.b1p)
        m.scatter_update(tf.IndexedSlices(m_rows, rows))
        v.scatter_update(tf.IndexedSlices(v_rows, rows))
        var.scatter_sub(tf.IndexedSlices(step * m_rows / (tf.sqrt(v_rows) + self.eps), rows))

    def _candidates(self, labels):
        tf = self.tf
        s = self.sampled
        true = tf.expand_dims(labels, 1)
        if s["sampler"] == "uniform":
            return tf.random.uniform_candidate_sampler(true, 1, s["num_sampled"], True, self.L)
        if s["sampler"] == "log_uniform":
            return tf.random.log_uniform_candidate_sampler(true, 1, s["num_sampled"], True,
                                                           self.L)
        if s["sampler"] == "unigram" and self.head is not None:
            n_head = int(self.head.shape[0])
            cand, t_exp, s_exp = tf.random.fixed_unigram_candidate_sampler(
                true, 1, s["num_sampled"] - n_head, True, self.L, unigrams=self.unigrams)
            in_head = tf.expand_dims(tf.gather(self.head_mask, labels), 1)
            return (tf.concat([self.head, cand], 0),
                    tf.where(in_head, tf.ones_like(t_exp), t_exp),
                    tf.concat([tf.ones([n_head], s_exp.dtype), s_exp], 0))
        if s["sampler"] == "unigram":
            return tf.random.fixed_unigram_candidate_sampler(
                true, 1, s["num_sampled"], True, self.L, unigrams=self.unigrams)
        raise ValueError(f"unknown candidate sampler {s['sampler']!r}")

    def _topk(self, x_rows, x_cols, x_vals, bsz, k):
        h = self._hidden(x_rows, x_cols, x_vals, bsz)
        return self.tf.math.top_k(self._logits(h), k=k).indices

    # -- numpy-facing helpers
    @staticmethod
    def _sparse_args(X):
        rows = np.repeat(np.arange(X.shape[0], dtype=np.int64), np.diff(X.indptr))
        return (rows, X.indices.astype(np.int64), X.data.astype(np.float32),
                np.int64(X.shape[0]))

    def train_batch(self, X, Y):
        if self.sampled and self.sampled.get("target") == "one":
            rows, labels, w = one_label_targets(Y, self._target_rng)
        else:
            rows, labels, w = label_targets(Y)
        return float(self.train_step(*self._sparse_args(X), rows, labels, w))

    def predict_topk(self, X, k=5):
        def block(Xb):
            return self.topk_step(*self._sparse_args(Xb), np.int32(k)).numpy()
        return predict_in_blocks(block, X, k, self.L)


def _train(spec, meta, X_tr, Y_tr, X_te, Y_te, X_ev, Y_ev, threads, sampled):
    tf = _import_tf(threads)
    model = _TFModel(tf, meta["n_features"], meta["n_labels"], spec["hidden"], spec["lr"],
                     spec["init"], spec["seed"], sampled=sampled,
                     label_counts=np.bincount(Y_tr.indices, minlength=meta["n_labels"]),
                     n_train=X_tr.shape[0])
    rec, final, extra = dense_loop.train(spec, X_tr, Y_tr, X_te, Y_te, X_ev, Y_ev, model)
    if sampled:
        extra["num_sampled"] = sampled["num_sampled"]
        extra["candidate_sampler"] = sampled["sampler"]
        extra["tf_target"] = sampled["target"]
        extra["tf_head"] = sampled["head"]
    return rec, final, extra


def run_dense(spec, meta, X_tr, Y_tr, X_te, Y_te, X_ev, Y_ev, threads):
    return _train(spec, meta, X_tr, Y_tr, X_te, Y_te, X_ev, Y_ev, threads, None)


def run_sampled(spec, meta, X_tr, Y_tr, X_te, Y_te, X_ev, Y_ev, threads):
    sampled = {"num_sampled": int(spec["num_sampled"]),
               "sampler": spec.get("candidate_sampler", "unigram"),
               "target": spec.get("tf_target", "all"), "head": int(spec.get("tf_head", 0))}
    return _train(spec, meta, X_tr, Y_tr, X_te, Y_te, X_ev, Y_ev, threads, sampled)
