"""A worker: what one batch in flight writes besides the model.

The model's arrays -- weights and biases, the optimizer's moments and step records, the LSH
tables, the label counts and draw tables -- are shared by every batch. Everything else a batch
writes is a worker's: its per-sample and per-thread scratch (``Scratch``, ``Block``,
``Store``), its losses, its dedup stamps and listings (the touched rows, the output rows and
their stamps, the input listed by feature) and the hidden layers' gradient buffers. Two
batches trained at the same time (``batches_in_flight`` > 1) each take a worker, so nothing
they write collides except the model's rows, which they update without locks (HOGWILD, as
SLIDE's threads do across samples).

A ``Network`` is its own first worker: it holds these same attributes for the batch it trains
itself (``Network.prepare``), so one batch at a time keeps the arrays and bits it always had.
A worker's per-thread rows are indexed by ``numba.get_thread_id()`` inside its kernels; that
id is local to the calling thread's parallel region, so two workers on two threads would
collide on one set of rows: each worker has rows for every thread it may run.
"""
import numba
import numpy as np

from slide.kernels.arrays import (make_block, make_output_rows, make_scratch, make_store,
                                  make_touched)


class Worker:
    """The scratch of one batch in flight over ``net`` (``allocate``); the attribute names are
    the ``Network``'s own, so the compiled batch reads either (``block_step``)."""

    def __init__(self, sc, store, block, losses, out_rows, out_stamp, touched_rows, GW, GB):
        self.sc = sc                        # per-sample active sets, per-thread buffers
        self.store = store                  # the output layer's inputs and extras' deltas
        self.block = block                  # the shared block's products and gradients
        self.losses = losses                # per-sample losses of the latest batch
        self.out_rows = out_rows            # the output rows a batch updates, per row
        self.out_stamp = out_stamp          # per output neuron: last batch that updated it
        self.touched_rows = touched_rows    # the hidden layers' touched rows and biases
        self.GW, self.GB = GW, GB           # the hidden layers' gradient buffers
        self.feature_rows = None            # the input listed by feature (grown on demand)

    @classmethod
    def allocate(cls, net, batch_size, n_threads, max_labels, out_stamp=None, touched_rows=None,
                 gradients=None):
        """A worker for batches of ``batch_size`` on up to ``n_threads`` threads over ``net``.
        ``out_stamp``, ``touched_rows`` and ``gradients`` (GW, GB): arrays to use instead of
        new ones (the network's own worker); new gradient buffers are zeros that the
        operating system maps only where a batch writes."""
        lay = net.layout
        sc = make_scratch(net.spec, net.lsh, net.uses_tables, batch_size, n_threads,
                          int(max_labels) + net.n_shared, net.min_active, net.n_shared)
        store = make_store(sc, lay.n_layers, lay.n_in[-1], batch_size, net.row_path)
        rows_threads = max(int(n_threads), numba.config.NUMBA_NUM_THREADS)
        if out_stamp is None:
            out_stamp = np.zeros_like(net.out_stamp)
        out_rows = None
        if net.row_path:
            cap = int(sc.a_off[-1] - sc.a_off[-2])
            out_rows = make_output_rows(out_stamp, lay.n_out[-1], lay.n_in[-1], batch_size,
                                        cap, rows_threads)
        block = None
        if net.batched:
            block = make_block(sc, lay.n_layers, lay.n_in[-1], batch_size, rows_threads,
                               net.n_shared, int(max_labels))
        if gradients is None:
            gradients = (np.zeros_like(net.GW), np.zeros_like(net.GB))
        if touched_rows is None:
            touched_rows = make_touched(lay)
        return cls(sc, store, block, np.zeros(batch_size, np.float64), out_rows, out_stamp,
                   touched_rows, *gradients)
