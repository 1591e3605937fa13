"""Fused members: K networks trained in one pass over the same batches, side by side on the
threads, and ranked as one stacked network (``SlideEnsemble(fused=True)``, ``SlideSearch``).

What the members share. One check of the data, one held-out split, one shuffled order of the
rows (every member sees batch t's rows at step t, as HFTA's fused models do), one clock (the
``time_budget`` and the learning-rate schedule's share of it) and, in an ensemble, one ranking
stack: the members' last hidden layers side by side, [H_1 ... H_K], under the output layer
[W_1 ... W_K] / K with the mean of their biases, whose logits are the mean of the members'
logits. The neighbour vote, the re-ranker and its linear classifiers are fitted once, on that
stacked network, instead of once a member: they are most of a ``SlideClassifier`` fit on the
real sets (``docs/design.md``, "Fused members").

What each member keeps. Its seed (initial weights, negatives), layers, learning rate,
schedule, loss and block settings; its network, optimizer and step records. Member k's
training is the one it gets alone with the same order of rows: the same calls on the same
state, one batch at a time (``tests/test_fused.py``: bit for bit on one thread).

How the pass runs. The batches of an epoch go in waves of ``WAVE_BATCHES``; in a wave each
member trains the wave's batches one after another, as one task of a pool of ``min(K,
n_threads)`` threads (a member's batch is one compiled call that releases the GIL), on
``n_threads // K`` Numba threads (one where the members are as many as the threads or more).
Between waves nothing runs: there the clock and the budget are checked, epochs end (each
member's optimizer synced) and the callback is called once a member. There a pass can also
pause, at an epoch's end or a clock reading, and a later call with some of its members go on
from there (``SlideSearch``'s successive halving).

What is not fused: each member's batch stays its own compiled call (its products, row steps
and optimizer): a member's flops and touched rows are its own however the members are laid
out. The pass's measured cost against training the networks one after another is in
``docs/design.md``, "Fused members".
"""
import math
import time
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from slide.data import iterate_minibatches
from slide.data.inputs import take_rows
from slide.estimator import SlideClassifier
from slide.kernels.output import OutputLayer
from slide.network import trainer
from slide.network.trainer import DivergenceError, NetworkSteps, scheduled_learning_rate

# batches a member trains between two joins of the members: the callback and the budget are
# checked once a wave (the same wave as ``slide.network.inflight``'s)
WAVE_BATCHES = 16


# what members trained in one pass must agree in (the same batches, as many of them); their
# layers may differ: each member's batch is its own call
PASS_PARAMS = ("batch_size", "epochs")
# and what members ranked as one stacked network must agree in besides
STACK_PARAMS = PASS_PARAMS + ("loss",)


def template_estimator(estimator):
    """The members' template of an ensemble or a search: ``estimator`` (an unfitted
    ``SlideClassifier``), or ``SlideClassifier()`` for None; ValueError for anything else."""
    if estimator is None:
        return SlideClassifier()
    if not isinstance(estimator, SlideClassifier):
        raise ValueError(f"estimator must be a SlideClassifier or None, got "
                         f"{type(estimator).__name__}")
    return estimator


def check_agree(members, names=STACK_PARAMS):
    """ValueError unless every member has the first one's values of ``names`` (scalars)."""
    first = members[0]
    for k, m in enumerate(members[1:], start=1):
        for name in names:
            a, b = getattr(first, name), getattr(m, name)
            if a != b:
                raise ValueError(f"fused members must agree in {name}: member 0 has {a!r}, "
                                 f"member {k} has {b!r}")


def stacked_output(members):
    """The members' output layers as one ``OutputLayer`` over their stacked hidden layers:
    W = [W_1 ... W_K] / K [n_labels, sum of their widths], b = the mean of the b_k, so its
    logits are the mean of the members' (a new array of that many floats)."""
    check_agree(members, ("loss",))
    outs = [m.network_.output_layer() for m in members]
    W = np.hstack([o.W for o in outs])
    W /= np.float32(len(outs))
    b = np.mean([o.b for o in outs], axis=0).astype(outs[0].b.dtype)
    return OutputLayer(np.ascontiguousarray(W), b, outs[0].sigmoid)


def stacked_hidden(members, X):
    """[H_1 ... H_K]: the members' last hidden layers of the rows of X side by side (float32
    [n, K h])."""
    return np.hstack([m.network_.hidden(X) for m in members])


class _MemberRun:
    """One member's part of the pass: its batch steps and whether it still trains."""

    def __init__(self, index, model):
        self.index = index
        self.model = model
        self.steps = NetworkSteps(model)
        self.active = True

    def train_wave(self, X, Y, wave, total_batches, time_done, n_threads):
        """Train the wave's batches (row ids, in order) one after another on this thread.
        Returns (mean loss, mean active size) of the wave."""
        numba.set_num_threads(n_threads)
        m = self.model
        losses, actives = [], []
        for rows in wave:
            serial = m.batches_ + 1
            lr = scheduled_learning_rate(float(m.learning_rate), m.lr_schedule,
                                         m.warmup_batches, serial, total_batches, time_done)
            loss, act, _ = self.steps.step(X, Y, rows, serial, lr, n_threads)
            if not math.isfinite(loss):
                m.network_.clear_gradients()
                raise DivergenceError(serial, m.epoch_, f"{loss} (member {self.index})")
            m.batches_ = serial
            m.samples_ += rows.shape[0]
            self.steps.after_step()
            m.batch_in_epoch_ += 1
            losses.append(loss)
            actives.append(act)
        return float(np.mean(losses)), float(np.mean(actives))


def warm_up_members(members, X, Y, n_threads):
    """Compile what ``train_members`` runs for ``members`` trained in one pass on
    ``n_threads`` threads: each member's batches one at a time on its share of the threads
    (the batch's one-thread build where the share is one thread: ``block_step.run_batch``),
    so each member warms up with that share. Returns the seconds spent compiling."""
    share = max(1, int(n_threads) // len(members))
    seconds = 0.0
    for m in members:
        n_threads_set = m.n_threads
        m.set_params(n_threads=share)
        try:
            seconds += m._warm_up(X, Y)
        finally:
            m.set_params(n_threads=n_threads_set)
    return seconds


def train_members(members, X, Y, rows, order_seed, n_threads, time_budget=None,
                  callback=None, eval_set=None, pause_epoch=None, pause_seconds=None,
                  diverged=None):
    """Train the built ``members`` (``SlideClassifier``s that agree in ``PASS_PARAMS`` and
    stand at the same position: fresh, or paused here together) together over the rows
    ``rows`` of (X, Y) (None: all), shuffled by ``order_seed``, on ``n_threads`` threads,
    within ``time_budget`` seconds if set (the learning-rate schedule then ends with the
    budget, as a single model's does). ``callback(k, member, info)`` runs once a wave for each
    member still training (``info`` as ``SlideClassifier.fit``'s, with ``batches``: the wave's
    size); a true return value stops that member. ``eval_set`` (checked (X, Y)): each member's
    P@1 on it in its ``history_`` at every epoch's end.

    The pass pauses, every member synced, at the end of epoch ``pause_epoch`` (1-based) or at
    the first wave end where its clock reached ``pause_seconds``; a later call goes on from
    there, on the same schedule (``SlideSearch``'s successive halving). A member whose loss
    turns non-finite raises its ``DivergenceError`` when the wave ends; with ``diverged`` (a
    dict) it stops instead, the others go on, and its error goes there under its index
    (``SlideSearch``: one trial's too-high learning rate does not end the search). Returns the
    pass's seconds so far (one clock for all members, which goes on from their
    ``train_seconds_``; each member's ``train_seconds_`` is set to it)."""
    check_agree(members, PASS_PARAMS + ("batches_", "epoch_", "batch_in_epoch_"))
    for member in members:
        trainer.check_trainable(member)
    first = members[0]
    start_epoch, start_batch = first.epoch_, first.batch_in_epoch_
    runs = [_MemberRun(k, m) for k, m in enumerate(members)]
    n_threads = max(1, int(n_threads))
    threads_each = max(1, n_threads // len(runs))
    bs = int(first.batch_size)
    n = X.shape[0] if rows is None else rows.shape[0]
    n_batches = -(-n // bs)
    epochs = trainer.resolve_epochs(first.epochs, X.shape[0], bs)
    total_batches = epochs * n_batches
    end_epoch = epochs if pause_epoch is None else min(epochs, int(pause_epoch))
    Y_train = Y if rows is None else take_rows(Y, rows)
    for run in runs:
        run.steps.start(X, Y_train, threads_each)
        run.model.stopped_ = run.model.budget_spent_ = False
    clock = float(first.train_seconds_)
    pool = ThreadPoolExecutor(min(len(runs), n_threads))
    try:
        with trainer.blas_single_thread():
            for epoch in range(start_epoch, end_epoch):
                t_epoch = time.perf_counter()
                batches = list(iterate_minibatches(n, bs, int(order_seed), epoch,
                                                   start_batch if epoch == start_epoch else 0))
                for lo in range(0, len(batches), WAVE_BATCHES):
                    active = [r for r in runs if r.active]
                    if not active:
                        return clock
                    if time_budget and clock >= time_budget:
                        for r in active:
                            r.model.budget_spent_ = True
                            r.model.sync()
                        return clock
                    if pause_seconds is not None and clock >= pause_seconds:
                        for r in active:
                            r.model.sync()
                        return clock
                    t0 = time.perf_counter()
                    wave = [b if rows is None else rows[b]
                            for b in batches[lo:lo + WAVE_BATCHES]]
                    time_done = clock / time_budget if time_budget else 0.0
                    futures = [pool.submit(r.train_wave, X, Y, wave, total_batches,
                                           time_done, threads_each) for r in active]
                    active, results = _wave_results(active, futures, diverged)
                    clock += time.perf_counter() - t0
                    _after_wave(active, results, clock, epoch, t_epoch, n_batches, callback,
                                len(wave), eval_set)
    finally:
        pool.shutdown(wait=True)
        numba.set_num_threads(n_threads)
    return clock


def _wave_results(active, futures, diverged):
    """(the runs that trained the wave whole, their (mean loss, mean active size)), once every
    member's part of the wave has ended. A member that diverged raises its
    ``DivergenceError``, or with ``diverged`` (a dict) stops and leaves it there."""
    done = []
    for run, future in zip(active, futures):
        try:
            done.append((run, future.result()))
        except DivergenceError as exc:
            if diverged is None:
                for other in futures:
                    other.exception()      # the others' parts end before the error leaves
                raise
            run.active = False
            diverged[run.index] = exc
    return [run for run, _ in done], [result for _, result in done]


def _after_wave(active, results, clock, epoch, t_epoch, n_batches, callback, wave_size,
                eval_set):
    """What ``trainer`` does between waves, for each member that trained the wave."""
    for run, (loss, act) in zip(active, results):
        m = run.model
        m.train_seconds_ = clock
        if m.batch_in_epoch_ >= n_batches:
            m.epoch_ += 1
            m.batch_in_epoch_ = 0
            trainer.end_epoch(m, epoch, t_epoch, eval_set)
        if callback is not None:
            info = trainer.callback_info(m, m.batches_, epoch, n_batches, loss, act, False,
                                         False, batches=wave_size)
            if callback(run.index, m, info):
                m.stopped_ = True
                run.active = False
