"""Several batches in flight between the driver and the shards (pipeline parallelism).

The synchronous loop (``driver.train_batch``) makes two round trips a batch: the shards'
statistics for the driver's H, then the shards' dL/dh for the driver's log Z; the driver, the
shards and the network between them take turns. Here one message a batch goes to each shard
and carries two batches' work: the backward pass of batch j (its log Z, learning rate) and the
forward pass of batch j + K (its H and labels). Its reply carries batch j's dL/dh and batch
j + K's statistics. ``K = depth - 1`` messages are in flight at once, so the shards work on
one message while the next ones travel and the driver forms the next H.

    message m_j (j = -K .. n-1):  backward of batch j (j >= 0), forward of batch j + K (< n)
    before m_j: the reply to m_{j-K} (batch j's statistics -> its log Z; batch j - K's dL/dh
                -> the hidden layer's step of batch j - K), then H of batch j + K

A shard runs its messages in order (``OutputShard.step``: backward first, then forward), so
its rows see every earlier batch's update before a forward pass, except the K - 1 batches
whose backward messages come later; its backward pass forms dL/dh from the rows of S as its
forward pass read them (``OutputShard.backward``). The driver's H of batch j + K is formed
after the hidden layer's step of batch j - K: it misses the steps of batches j - K + 1 ..
j + K - 1, a delay of at most ``2 K - 1 = 2 depth - 3`` batches (depth 2: one batch). The
batches come in waves (``slide.network.trainer._train_waves``); a wave ends with the pipeline
drained, so checkpoints, the callback, the time budget and a shard's failure all meet a model
with no batch in flight.
"""
import math
from collections import deque

import numpy as np

from slide.distributed.driver import combine, local_labels
from slide.distributed.ray_backend import ShardFailure
from slide.params import is_int

# executions a shard graph keeps in flight at least (``RayBackend.compile_graph``): room for
# the usual depths without a second compile
GRAPH_IN_FLIGHT = 8

# batches of a wave: each wave fills and drains the pipeline (K round trips without overlap)
WAVE_BATCHES = 64


def check_pipeline_depth(value):
    """``value`` if it is a positive integer (1: the synchronous loop), else ValueError."""
    if is_int(value) and not isinstance(value, bool) and value >= 1:
        return int(value)
    raise ValueError(f"pipeline_depth must be a positive integer (1: no pipelining), got "
                     f"{value!r}")


class ShardPipeline:
    """``slide.network.trainer``'s in-flight runner for a sharded model (``run_wave``,
    ``wave_size``, ``close``) with ``depth`` batches in flight (depth >= 2)."""

    def __init__(self, model, depth, n_threads):
        self.model = model
        self.k = int(depth) - 1
        self.n_threads = n_threads

    def wave_size(self):
        return max(WAVE_BATCHES, 4 * self.k)

    def close(self):
        """Nothing to close: the backend's graph stands for the next fit."""

    def run_wave(self, X, Y, batches, seed=None, optimizer=None):
        """Train ``batches``, a list of (rows, serial, learning rate) in batch order. Returns,
        in the same order, each batch's (mean loss, mean active size); a batch whose loss is
        not finite applied nothing, and the batches after it report NaN (the pipeline drains
        first: the earlier batches are applied). None when a shard died: the model went back
        to its last checkpoint (``ShardedSlideClassifier._recover``)."""
        try:
            return self._run(X, Y, batches)
        except ShardFailure as exc:
            self.model._recover(exc, Y, self.n_threads)
            return None

    def _run(self, X, Y, batches):
        m, K, n = self.model, self.k, len(batches)
        wave = _Wave(m, X, Y, batches)
        results = [(math.nan, 0.0)] * n
        for j in range(-K, n):
            backward = None
            if j >= 0:
                replies = wave.receive()             # m_{j-K}: batch j's statistics
                if j - K >= 0:
                    wave.apply(j - K, replies)
                backward, loss, active = wave.normaliser(j, [st for _, st in replies])
                results[j] = (loss, active)
                if not math.isfinite(loss):
                    # nothing of batch j is applied; the messages in flight carry the earlier
                    # batches' backward passes, which are
                    for i in range(j - K + 1, j):
                        replies = wave.receive()
                        if i >= 0:
                            wave.apply(i, replies)
                    return results
            wave.send(backward, j + K if j + K < n else None)
        for i in range(n - K, n):
            replies = wave.receive()
            if i >= 0:
                wave.apply(i, replies)
        m.bytes_per_batch_ = wave.bytes / max(n, 1)
        return results


class _Wave:
    """One wave's batches between the driver and the shards: the messages in flight (oldest
    first), the driver's part of each batch whose backward pass is still to come, and the
    bytes exchanged."""

    def __init__(self, model, X, Y, batches):
        self.model, self.X, self.Y, self.batches = model, X, Y, batches
        self.flight = {}         # batch index -> (rows, H, global label counts)
        self.pending = deque()
        self.bytes = 0

    def send(self, backward, i):
        """The message of ``backward`` (or None) and batch i's forward pass (i None: none)."""
        m = self.model
        n_shards = len(m.bounds_) - 1
        forward = [None] * n_shards
        if i is not None:
            rows, serial, _ = self.batches[i]
            H = m.hidden_.forward(self.X, rows)
            labels, n_labels = local_labels(self.Y, rows, m.bounds_)
            self.flight[i] = (rows, H, n_labels)
            forward = [(serial, H, p, q) for p, q in labels]
            self.bytes += n_shards * H.nbytes + sum(p.nbytes + q.nbytes for p, q in labels)
        if backward is not None:
            _, log_z, n_labels, _ = backward
            self.bytes += n_shards * (log_z.nbytes + n_labels.nbytes)
        self.pending.append(m.backend_.submit_each(
            "step", [(backward, f) for f in forward]))

    def receive(self):
        """The replies to the oldest message in flight: per shard (dH or None, stats or
        None)."""
        replies, _ = self.model.backend_.wait(self.pending.popleft())
        self.bytes += sum(a.nbytes for reply in replies for a in reply if a is not None)
        return replies

    def normaliser(self, i, stats):
        """Batch i's backward message (serial, log Z, label counts, learning rate) from its
        shards' statistics, its mean loss and mean active size."""
        _, serial, lr = self.batches[i]
        _, _, n_labels = self.flight[i]
        log_z, loss = combine(stats, n_labels)
        active = float(sum(st[4].mean() for st in stats))
        return (serial, log_z, n_labels, lr), loss, active

    def apply(self, i, replies):
        """The hidden layer's step of batch i from the shards' dH."""
        rows, H, _ = self.flight.pop(i)
        dHs = [d for d, _ in replies]
        # writable: Ray hands large results back as read-only views of its object store
        dH = np.array(dHs[0], np.float32) if len(dHs) == 1 else \
            np.sum(dHs, axis=0, dtype=np.float32)
        _, serial, lr = self.batches[i]
        hidden = self.model.hidden_
        hidden.optimizer.learning_rate = lr
        hidden.backward(self.X, rows, H, dH, serial)
