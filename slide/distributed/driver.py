"""The driver's side of the sharded network: the hidden layer (``HiddenLayer``: weights, sparse
Adam over the touched input features, forward / backward kernels) and one training batch
across the shards (``train_batch``): hidden activations out, partial softmax statistics in,
global normalisers out, dL/dh in (see ``slide.distributed.shard`` for the shard's side; with
several batches in flight, ``slide.distributed.pipeline``).
"""
import math

import numpy as np

from slide.distributed.kernels import (combine_partials, hidden_deltas, hidden_forward_batch,
                                       init_rows_like_global, split_labels)
from slide.kernels.arrays import Params, Spec, csr, i64, make_touched
from slide.kernels.layers import Layout
from slide.kernels.rng import init_stream
from slide.kernels.touched import collect_touched, feature_entries
from slide.network.block import feature_rows
from slide.network.optim import SparseOptimizer


class HiddenLayer:
    """The first (only) hidden layer of a sharded network: W0T [n_features, hidden] and b0 in
    the single-process layout and initialisation (``slide.kernels.layers``), so layer 0 of a sharded
    model and of a ``SlideClassifier`` with the same seed start identical."""

    def __init__(self, n_features, n_hidden, seed, optimizer, learning_rate, beta1, beta2,
                 epsilon, init=True):
        self.n_features, self.n_hidden = int(n_features), int(n_hidden)
        self.layout = Layout((self.n_features, self.n_hidden))
        self.W = np.zeros(self.layout.n_weights, np.float32)
        self.B = np.zeros(self.layout.n_biases, np.float32)
        if init:
            # init_params' Glorot std of layer 0 (fan-in: the input features)
            std = np.sqrt(2.0 / (self.n_features + self.n_hidden))
            init_rows_like_global(self.W, 0, 0, std, np.uint64(seed), np.int64(init_stream(0)))
        # no weight gradient buffer: the rows' step forms each row's gradient itself
        self.GW = np.zeros(0, np.float32)
        self.GB = np.zeros_like(self.B)
        lay = self.layout
        self.spec = Spec(1, lay.n_in, lay.n_out, lay.w_off, lay.b_off, np.zeros(1, np.bool_),
                         i64([0]), 0, np.zeros(7, np.int64))
        self.touched = make_touched(lay)
        self.optimizer = SparseOptimizer(optimizer, lay, learning_rate, beta1, beta2, epsilon)
        self.feature_rows = None      # the batch's input by feature (grown on demand)
        self._no_ids = np.zeros((1, 1), np.int32)
        self._no_act = np.zeros((1, 1), np.int64)

    @property
    def params(self):
        return Params(self.W, self.B, self.GW, self.GB)

    def forward(self, X, rows):
        """Hidden activations [len(rows), hidden] of rows ``rows`` of the CSR matrix X."""
        H = np.zeros((rows.shape[0], self.n_hidden), np.float32)
        hidden_forward_batch(self.W, self.B, self.n_hidden, csr(X), rows, H)
        return H

    def backward(self, X, rows, H, dH, serial):
        """The optimizer step of the batch from dL/dh (the shards' sum; masked here in place):
        the biases from their summed gradient, the input features' rows as the batched
        engine steps its first layer (each row's gradient formed from the deltas, no
        gradient buffer: ``row_steps.first_layer_step``)."""
        Xc = csr(X)
        hidden_deltas(H, dH, self.GB)
        _, nbias = collect_touched(self.spec, self.layout.row_off, i64([0, 0]), self._no_ids,
                                   self._no_act, Xc, rows, self.touched, np.int64(serial),
                                   False, False)
        self.optimizer.step(self.params, self.touched, 0, nbias)
        frows = feature_rows(self, self.layout, X, rows)
        n_uniq = feature_entries(Xc, rows, frows)
        self.optimizer.step_first(self.W, frows, n_uniq, Xc.dat, dH)

    def reset_stamps(self):
        """Forget which rows the past batches touched (before batch serials are reused)."""
        self.touched = make_touched(self.layout)

    def sync(self):
        self.optimizer.flush(self.W, self.B)

    def state_arrays(self):
        arrays = {"W": self.W, "B": self.B}
        arrays.update(self.optimizer.state_arrays())
        return arrays


def local_labels(Y, rows, bounds):
    """Per shard, the batch's labels in its range as a local CSR (ptr int64, ind int32), and
    each sample's global label count. ``bounds``: the shards' boundaries (lo_0, ..., hi_last);
    Y's label ids sorted in each row (slide's canonical form)."""
    n_sh, nb = len(bounds) - 1, rows.shape[0]
    n_max = int(Y.indptr[rows + 1].sum() - Y.indptr[rows].sum())
    ptr = np.zeros((n_sh, nb + 1), np.int64)
    ind = np.zeros((n_sh, max(n_max, 1)), np.int32)
    n_labels = np.zeros(nb, np.int64)
    split_labels(csr(Y), rows, np.asarray(bounds, np.int64), ptr, ind, n_labels)
    return [(ptr[q], ind[q, :ptr[q, -1]]) for q in range(n_sh)], n_labels


def combine(stats, n_labels):
    """(log Z per sample, mean loss) from the shards' statistics [S][5, nb]: the loss of the
    softmax against 1/|y| on each label (samples without labels contribute 0, as in
    ``slide.kernels.sample.output_loss``)."""
    st = np.stack(stats)
    log_z = combine_partials(np.ascontiguousarray(st[:, 0]), np.ascontiguousarray(st[:, 1]))
    lz = st[:, 2].sum(axis=0)
    nf = st[:, 3].sum(axis=0)
    ny = np.maximum(n_labels, 1)
    per = np.where(n_labels > 0, (nf * log_z - lz) / ny, 0.0)
    return log_z, float(per.mean())


def train_batch(hidden, backend, bounds, X, Y, rows, serial, learning_rate):
    """One batch across the shards, synchronously: the forward pass's message and its
    replies, then the backward pass's (``OutputShard.step``); returns (mean loss, bytes
    exchanged with the shards, mean active output neurons per sample over all shards). A
    non-finite loss is returned before anything is updated (the caller raises)."""
    H = hidden.forward(X, rows)
    labels, n_labels = local_labels(Y, rows, bounds)
    S = len(labels)
    stats = [st for _, st in backend.call_each("step", [(None, (serial, H, p, i))
                                                        for p, i in labels])]
    log_z, loss = combine(stats, n_labels)
    active = float(sum(st[4].mean() for st in stats))
    sent = S * H.nbytes + sum(p.nbytes + i.nbytes for p, i in labels) + \
        sum(s.nbytes for s in stats)
    if not math.isfinite(loss):
        return loss, sent, active
    hidden.optimizer.learning_rate = learning_rate
    backward = (serial, log_z, n_labels, learning_rate)
    dHs = [d for d, _ in backend.call_each("step", [(backward, None)] * S)]
    # a writable copy: the backward kernel masks dH in place, and Ray hands large results
    # back as read-only views of its object store
    dH = np.array(dHs[0], np.float32) if S == 1 else np.sum(dHs, axis=0, dtype=np.float32)
    sent += S * (log_z.nbytes + n_labels.nbytes) + sum(d.nbytes for d in dHs)
    hidden.backward(X, rows, H, dH, serial)
    return loss, sent, active
