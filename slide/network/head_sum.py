"""The exact head's gradients summed over a worker's batches (several batches in flight).

The exact head (``exact_head`` of the shared block: the most frequent labels) is in every
batch. One batch at a time steps its rows every batch. With ``W`` batches in flight, every
worker stepping them every batch puts the same rows -- their weights and both moments -- in
every core's writes, and their cache lines move between the cores (``docs/design.md``,
"Batches in flight"). So a worker adds its batch's gradient of each head row into its own
``HeadSum`` and steps the head every ``W``-th of its batches with the sum: over all workers
the head is still stepped about once a batch, as one batch at a time steps it, with the
gradients of ``W`` batches; catch-up Adam moves each head row through the steps between as
it moves any row a batch did not touch. At a wave's end the workers' sums are added and
stepped once (``InFlight.run_wave``; a sum of nothing is the zero-gradient step the catch-up
would apply anyway), so a checkpoint, an evaluation or a rehash never sees a pending sum.
One batch at a time (``batches_in_flight=1``) passes ``NO_HEAD`` and keeps its bits.
"""
from typing import NamedTuple

import numpy as np


class HeadSum(NamedTuple):
    """A worker's pending head gradients, read by ``row_steps.batch_row_steps``."""
    slot: np.ndarray         # int32 [n_out]: each output neuron's row in dW / db, -1 outside
    dW: np.ndarray           # float32 [n_head, n_in]: the summed weight gradients
    db: np.ndarray           # float32 [n_head]: the summed bias gradients
    flush: bool              # this batch steps the head with its sum (and clears it)


# no head sum: every block row stepped by the batch that touched it
NO_HEAD = HeadSum(np.zeros(0, np.int32), np.zeros((0, 1), np.float32), np.zeros(0, np.float32),
                  True)


def head_slots(head, n_out):
    """int32 [n_out]: the position of each output neuron in the sorted ``head``, -1 outside."""
    slot = np.full(int(n_out), -1, np.int32)
    slot[np.asarray(head, np.int64)] = np.arange(len(head), dtype=np.int32)
    return slot


class WorkerHeadSum:
    """One worker's sums (``HeadSum`` arrays) and how many batches they hold; ``every``: the
    batches a sum spans."""

    def __init__(self, slot, n_in, every):
        n_head = int((slot >= 0).sum())
        self.slot = slot
        self.dW = np.zeros((n_head, int(n_in)), np.float32)
        self.db = np.zeros(n_head, np.float32)
        self.every = int(every)
        self.held = 0

    def next_batch(self):
        """The ``HeadSum`` of the worker's next batch: its sum stepped there when it then
        holds ``every`` batches."""
        self.held += 1
        flush = self.held >= self.every
        if flush:
            self.held = 0
        return HeadSum(self.slot, self.dW, self.db, flush)

    def clear(self):
        """Zero the sums and the count (after ``InFlight.run_wave`` stepped them)."""
        self.dW[:] = 0.0
        self.db[:] = 0.0
        self.held = 0
