"""Several batches in flight: ``W`` workers train whole batches at the same time over the
model's shared weights, without locks (HOGWILD across batches).

One batch at a time runs every step of a batch as a parallel loop over all threads, and each
loop ends at a join: on many cores those joins and the serial pieces between them bound the
speed-up (``docs/design.md``, "Many cores"). Here each worker runs whole batches on its own
threads (``n_threads // W`` each, one where threads and workers are as many), so a batch's
steps need no join with another's.

The batches are grouped into waves. A wave's batches are claimed on the calling thread in
batch order (their negatives drawn and their optimizer steps claimed one after another:
``block_step.claim``) and queued; each worker takes the next batch from the queue as soon as
it is free, binds it to its scratch (``block_step.bind``) and trains it, so a slow batch does
not hold the others; the wave ends when the queue is empty and every worker is done.
Between waves nothing is in flight: the trainer reports the wave, runs the rehash schedule,
ends epochs, checks the time budget and calls the callback there, so a checkpoint never holds
a half-applied batch. While a wave runs, at most ``W`` batches are in flight, each reading
weights that the others are updating: the staleness of a read is at most ``W - 1`` batches,
and results vary from run to run like any HOGWILD training.
"""
import queue
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numba

from slide.network import block_step
from slide.network.worker import Worker
from slide.params import is_int

# a wave holds this many batches a worker: every wave ends at a join of the workers, so
# longer waves spread its cost over more batches (a batch's staleness stays W - 1: a worker
# trains its batches one after another); the callback and the checkpoints come once a wave.
# 64 trained no faster on 2 cores (docs/design.md, "Waves")
BATCHES_A_WORKER = 16


def check_batches_in_flight(value):
    """``value`` if it is "auto" or a positive integer, else ValueError."""
    if isinstance(value, str) and value == "auto":
        return value
    if is_int(value) and value >= 1:
        return int(value)
    raise ValueError(f"batches_in_flight must be a positive integer or 'auto', got {value!r}")


# "auto" keeps at most this many batches in flight: on 2 cores, 2 and 4 batches in flight kept
# one batch at a time's P@1, P@5 and PSP@5 within noise, 8 lost 1.6 points of P@1 at 200k labels
# and 16 lost 3.7 (bench/results/inflight_2core.md)
AUTO_MOST_IN_FLIGHT = 4


# a fit with more batches in flight than AUTO_MOST_IN_FLIGHT trains the first WARM_SHARE of
# its planned batches with AUTO_MOST_IN_FLIGHT, and the rest with all of them: the staleness of
# many workers costs accuracy early in training, while the weights move fast. 16 in flight
# from the first batch lost 4.1 points of P@1 at 200k labels (one epoch) and 1.7 on debcontents
# (three), a first quarter at 4 lost 0.5 and nothing; a first tenth at 4 lost 1.8, and a
# linear learning-rate warm-up over a tenth or a quarter, 16 throughout, lost 5.0 and 3.4
# (bench/results/inflight_staleness_2core_88ee465.md, "The first quarter at 4 in flight")
WARM_SHARE = 0.25


def resolve_batches_in_flight(value, n_threads, applies):
    """The number of workers ``value`` stands for: ``"auto"`` one a thread (each batch then
    runs on one thread: no join inside a batch), at most AUTO_MOST_IN_FLIGHT (beyond, the
    threads are shared out among them); an integer itself; 1 where the network does not take
    the compiled batch (``applies`` False: the per-sample engine, a dense network). An epoch
    of fewer batches drops the workers it would leave idle (``plan_layout``)."""
    value = check_batches_in_flight(value)
    if not applies:
        return 1
    return min(max(1, int(n_threads)), AUTO_MOST_IN_FLIGHT) if value == "auto" else value


def batch_builds(value, n_threads):
    """The builds of the compiled batch that a fit with ``batches_in_flight=value`` on
    ``n_threads`` threads takes (``block_step.run_batch``), as a frozenset of "one thread a
    batch": its workers' and, where fewer train its first batches (``warm_workers``), theirs."""
    n_workers = resolve_batches_in_flight(value, n_threads, True)
    return frozenset(_threads_each(n_threads, w) == 1
                     for w in {n_workers, warm_workers(n_workers)})


def _threads_each(n_threads, n_workers):
    return max(1, int(n_threads) // int(n_workers))


class Layout(NamedTuple):
    """How a fit's batches run: ``n_workers`` of them in flight (1: one at a time), each on
    ``threads_each`` threads."""
    n_workers: int
    threads_each: int


def plan_layout(value, n_threads, n_batches, applies):
    """The ``Layout`` of a fit with ``batches_in_flight=value`` on ``n_threads`` threads whose
    epochs have ``n_batches`` batches: the workers ``value`` stands for share the threads out,
    then an epoch of fewer batches drops the workers it would leave idle and keeps each
    batch's threads. So the build of the compiled batch (one thread, or parallel loops) is the
    one ``batch_builds`` names, which the warm-up compiled, whatever the data's size; a set of
    one batch an epoch trained on both of 2 threads would compile the parallel build inside the
    training clock (bench/results/first_fit_debtags.md, "A small set's first fit")."""
    wanted = resolve_batches_in_flight(value, n_threads, applies)
    return Layout(max(1, min(wanted, int(n_batches))), _threads_each(n_threads, wanted))


class InFlight:
    """The workers of ``layout`` (a ``Layout``) over ``net`` (a network the compiled batch
    applies to); ``run_wave`` trains a list of batches. The network is the first worker (its
    own scratch); ``close`` ends the workers' threads."""

    def __init__(self, net, layout):
        self.net = net
        self.threads_each = int(layout.threads_each)
        batch_size, _, max_labels = net._scratch_key
        self.workers = [None] + [Worker.allocate(net, batch_size, self.threads_each,
                                                 max_labels)
                                 for _ in range(int(layout.n_workers) - 1)]
        net.workers = self.workers[1:]
        self.pool = ThreadPoolExecutor(len(self.workers))

    @property
    def n_workers(self):
        return len(self.workers)

    def _work(self, worker, X, claims, results):
        """One worker's share of a wave: the next claimed batch from ``claims`` until it
        holds None, each result into ``results`` at the batch's place."""
        numba.set_num_threads(self.threads_each)
        while True:
            item = claims.get()
            if item is None:
                return
            i, claimed = item
            results[i] = block_step.run_batch(block_step.bind(self.net, claimed, X, worker))

    def run_wave(self, X, Y, batches, seed, optimizer):
        """Train ``batches``, a list of (rows, serial, learning rate) in batch order. Returns,
        in the same order, each batch's (mean loss, mean active size); a batch whose loss is
        not finite applied nothing (its optimizer step stays claimed: the later batches'
        steps were claimed after it)."""
        claims = queue.SimpleQueue()
        results = [None] * len(batches)
        done = [self.pool.submit(self._work, w, X, claims, results) for w in self.workers]
        for i, (rows, serial, lr) in enumerate(batches):
            optimizer.learning_rate = lr
            claims.put((i, block_step.claim(self.net, X, Y, rows, seed, serial, optimizer,
                                            self.threads_each)))
        for _ in self.workers:
            claims.put(None)
        for f in done:
            f.result()
        return [(loss, active) for _, loss, active in results]

    def wave_size(self):
        return BATCHES_A_WORKER * self.n_workers

    def close(self):
        self.pool.shutdown(wait=True)
        self.net.workers = []


def warm_batches(n_workers, total_batches):
    """How many of a fit's ``total_batches`` batches train with ``warm_workers(n_workers)``
    workers before all ``n_workers`` take over (0: all of them from the first)."""
    if n_workers <= AUTO_MOST_IN_FLIGHT:
        return 0
    return int(WARM_SHARE * int(total_batches))


def warm_workers(n_workers):
    """The workers of a fit's first ``warm_batches`` batches."""
    return min(int(n_workers), AUTO_MOST_IN_FLIGHT)


class WarmedInFlight:
    """``InFlight`` of ``warm_workers`` workers (``n_threads`` shared out among them) until the
    fit's position reaches ``warm_until`` batches, then of ``layout``'s: the trainer's waves
    run through it as through one ``InFlight`` (``run_wave``, ``wave_size``, ``close``), and
    the workers change between two waves, where nothing is in flight."""

    def __init__(self, net, layout, n_threads, warm_until, position):
        self.net = net
        warm = warm_workers(layout.n_workers)
        self.warm_layout = Layout(warm, _threads_each(n_threads, warm))
        self.final_layout = layout
        self.warm_until = int(warm_until)
        self.position = int(position)           # batches trained before the next wave
        self.crew = InFlight(net, self._wanted())

    def _wanted(self):
        return self.warm_layout if self.position < self.warm_until else self.final_layout

    def run_wave(self, X, Y, batches, seed, optimizer):
        if self.crew.n_workers != self._wanted().n_workers:
            self.crew.close()
            self.crew = InFlight(self.net, self._wanted())
        results = self.crew.run_wave(X, Y, batches, seed, optimizer)
        self.position = batches[-1][1]          # the wave's last serial
        return results

    def wave_size(self):
        return BATCHES_A_WORKER * self._wanted().n_workers

    def close(self):
        self.crew.close()
