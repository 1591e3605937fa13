"""The training loop of ``SlideClassifier``: batches and epochs, divergence, rehash timing,
the per-batch callback and the verbose progress lines.

The functions take the fitted estimator (its ``network_``, ``optimizer_``, ``schedule_`` and
position attributes ``batches_``, ``samples_``, ``epoch_``, ``batch_in_epoch_``,
``train_seconds_``, ``lsh_seconds_``, ``history_``) and advance it; one batch is one Numba call
(``Network.train_batch``, or ``train_batch_dense`` for a network without sparse layers).
"""
import contextlib
import math
import time

import numba
import numpy as np
from threadpoolctl import threadpool_limits

from slide import defaults
from slide.data import iterate_minibatches
from slide.data.inputs import take_rows
from slide.network import block_step
from slide.network.inflight import InFlight, WarmedInFlight, plan_layout, warm_batches


LR_SCHEDULES = ("constant", "linear", "cosine")

CALLBACK_INFO_KEYS = ("batch", "epoch", "batch_in_epoch", "samples", "loss", "train_seconds",
                      "active_mean", "rehashed", "rebuilt")


# epochs="auto" (the measurements: slide.defaults)
AUTO_EPOCH_BATCHES = defaults.AUTO_EPOCH_BATCHES
AUTO_EPOCHS_MIN, AUTO_EPOCHS_MAX = defaults.AUTO_EPOCHS_MIN, defaults.AUTO_EPOCHS_MAX


def resolve_epochs(epochs, n_rows, batch_size):
    """The number of epochs ``epochs`` stands for on ``n_rows`` training rows: itself, or for
    "auto" the multiple of the batches per epoch nearest to AUTO_EPOCH_BATCHES, clipped to
    [AUTO_EPOCHS_MIN, AUTO_EPOCHS_MAX]."""
    if epochs != "auto":
        return int(epochs)
    per_epoch = max(1, math.ceil(int(n_rows) / int(batch_size)))
    return int(min(AUTO_EPOCHS_MAX, max(AUTO_EPOCHS_MIN, round(AUTO_EPOCH_BATCHES / per_epoch))))


def resolve_hidden_sizes(hidden_sizes, n_features, n_labels):
    """The hidden widths ``hidden_sizes`` stands for on data of ``n_features`` features and
    ``n_labels`` labels: itself (a tuple), or for "auto" one layer of AUTO_HIDDEN_WIDTH where
    the model at that width (weights and Adam's two moments, float32) takes at most
    AUTO_HIDDEN_MAX_MODEL_BYTES, else one of AUTO_HIDDEN_NARROW."""
    if not isinstance(hidden_sizes, str):
        return tuple(int(h) for h in hidden_sizes)
    model_bytes = 3 * 4 * (int(n_features) + int(n_labels)) * defaults.AUTO_HIDDEN_WIDTH
    if model_bytes <= defaults.AUTO_HIDDEN_MAX_MODEL_BYTES:
        return (defaults.AUTO_HIDDEN_WIDTH,)
    return (defaults.AUTO_HIDDEN_NARROW,)


class DivergenceError(RuntimeError):
    """Training produced a non-finite loss."""

    def __init__(self, batch, epoch, loss):
        self.batch = batch
        self.epoch = epoch
        self.loss = loss
        super().__init__(f"training diverged: non-finite mean loss ({loss}) at batch {batch} "
                         f"(epoch {epoch}); lower learning_rate")


def scheduled_learning_rate(base, schedule, warmup_batches, batch, total_batches,
                            time_done=0.0):
    """The learning rate of batch number ``batch`` (1-based serial over the whole run) of a run
    of ``total_batches`` batches.

    ``time_done`` (a run with a ``time_budget``): the share of the budget already spent before
    this batch; the decay then follows whichever of the batch count and the clock is further
    along, so the schedule ends when the budget does (or at ``total_batches``, if sooner).

    Warm-up: batches 1..W (W = ``warmup_batches``) use base * batch / W. Then "constant" keeps
    ``base``; "linear" and "cosine" decay from ``base`` (first batch after the warm-up) towards 0,
    reaching base / (total - W) (linear) at the last batch, never 0, so no batch is wasted.
    Batches past ``total_batches`` (``partial_fit`` beyond ``epochs``) keep the last batch's
    rate."""
    batch = max(int(batch), 1)
    warm = int(warmup_batches)
    if batch <= warm:
        return base * batch / warm
    if schedule == "constant":
        return base
    span = max(int(total_batches) - warm, 1)
    # fraction of the decay already done before this batch: 0 for the first decayed batch,
    # (span - 1) / span for the last one
    done = min(batch - warm - 1, span - 1) / span
    done = max(done, min(float(time_done), (span - 1) / span))
    if schedule == "linear":
        return base * (1.0 - done)
    if schedule == "cosine":
        return base * 0.5 * (1.0 + math.cos(math.pi * done))
    raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {schedule!r}")


def blas_single_thread():
    """OpenBLAS threads and Numba's OpenMP threads spin against each other (4x slower measured
    on 2 cores): BLAS calls made beside Numba kernels run single-threaded."""
    try:
        return threadpool_limits(1, user_api="blas")
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        return contextlib.nullcontext()


def ensure_lsh(model):
    """Build the sparse layers' LSH indices if they do not exist yet."""
    net = model.network_
    if net.uses_tables and not net.indices:
        t0 = time.perf_counter()
        net.build_indices()
        model.lsh_seconds_ = getattr(model, "lsh_seconds_", 0.0) + time.perf_counter() - t0


def maybe_rehash(model):
    """Rehash / rebuild the tables when the schedule says so (after the optimizer step of the
    current batch, so the tables see the updated weights). Returns (rehashed, rebuilt)."""
    net = model.network_
    if not net.uses_tables:
        return False, False
    rehash, rebuild = model.schedule_.step(model.batches_)
    if rebuild or rehash:
        if not net.weights_finite():
            raise DivergenceError(model.batches_, model.epoch_, "non-finite weights")
        t0 = time.perf_counter()
        if rebuild:
            net.rebuild(model.batches_)
        else:
            net.rehash(model.batches_)
        model.lsh_seconds_ = getattr(model, "lsh_seconds_", 0.0) + time.perf_counter() - t0
    return rehash, rebuild


def end_epoch(model, epoch, t_epoch, eval_set):
    """Close an epoch: sync the optimizer, evaluate, append to ``history_``."""
    rec = {"epoch": epoch, "seconds": time.perf_counter() - t_epoch}
    model.sync()
    if eval_set is not None:
        rec["P@1"] = model.score(*eval_set)
    model.history_.append(rec)
    if model.verbose >= 1:
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in rec.items()))


def _prepare(model, X, Y, n_threads):
    """Scratch sizes, label counts, the log-prior output biases (first batch only), tables."""
    net = model.network_
    n = Y.shape[0]
    max_labels = int(np.diff(Y.indptr).max()) if n else 1
    net.prepare(int(model.batch_size), n_threads, max(1, max_labels))
    net.set_label_counts(np.bincount(Y.indices, minlength=Y.shape[1]))
    if model.batches_ == 0 and model.output_bias_init == "log_prior" and n:
        # the output biases start at the log label frequencies: a network that has not
        # learned anything yet already ranks labels by popularity, and labels without a
        # training point start far below the rest (a dense softmax needs most of an epoch
        # of Adam steps on every row to learn this prior; a sampled one, much longer)
        counts = np.bincount(Y.indices, minlength=Y.shape[1]).astype(np.float64)
        net.layout.bias_view(net.B, net.layout.n_layers - 1)[:] = np.log(
            (counts + 1.0) / (n + Y.shape[1]))
    ensure_lsh(model)


def _train_one_batch(model, X, Y, rows, serial):
    """One batch (one Numba call); returns (mean loss, mean active size)."""
    net = model.network_
    if net.sparse.any():
        return net.train_batch(X, Y, rows, model.seed_, serial, model.optimizer_)
    return net.train_batch_dense(X, Y, rows, serial, model.optimizer_)


class NetworkSteps:
    """The per-model part of ``train`` for a model that holds its whole network in this
    process (``SlideClassifier``); ``ShardedSlideClassifier`` has its own (its shards).

    ``start(X, Y, n_threads)`` readies a run; ``step(X, Y, rows, serial, lr, n_threads)``
    trains one batch at learning rate ``lr`` and returns ``(mean loss, mean active size,
    extra callback fields)``, or None when the model went back to an earlier position (a
    sharded model restored from its last checkpoint after a shard died): the loop then goes on
    from there; ``after_step()`` runs the rehash schedule and returns (rehashed, rebuilt)."""

    def __init__(self, model):
        self.model = model

    def start(self, X, Y, n_threads):
        model = self.model
        _prepare(model, X, Y, n_threads)
        # the serving index and the neighbour memory were built from the weights this run
        # changes
        model.network_.serving = None
        model.rank_.clear()

    def step(self, X, Y, rows, serial, lr, n_threads):
        # the optimizer reads its learning_rate at every step and records the step's rate
        # (a later sync catches rows up at the rates of the steps they missed)
        self.model.optimizer_.learning_rate = lr
        loss, act = _train_one_batch(self.model, X, Y, rows, serial)
        return loss, act, {}

    def after_step(self):
        return maybe_rehash(self.model)

    def layout(self, n_threads, n_batches):
        """How this run's batches run (``slide.network.inflight.plan_layout``)."""
        net = self.model.network_
        return plan_layout(getattr(self.model, "batches_in_flight", 1), n_threads, n_batches,
                           net.sparse.any() and block_step.applies(net))

    def in_flight(self, n_threads, n_batches, total_batches):
        """The workers of a run with several batches in flight (``slide.network.inflight``),
        or None for one batch at a time. Beyond ``AUTO_MOST_IN_FLIGHT`` of them, the first
        ``WARM_SHARE`` of the fit's ``total_batches`` train with that many
        (``WarmedInFlight``)."""
        model = self.model
        layout = self.layout(n_threads, n_batches)
        if layout.n_workers == 1:
            return None
        warm_until = warm_batches(layout.n_workers, total_batches)
        if model.batches_ < warm_until:
            return WarmedInFlight(model.network_, layout, n_threads, warm_until,
                                  model.batches_)
        return InFlight(model.network_, layout)

    def batch_threads(self, n_threads, n_batches):
        """The threads of a batch trained one at a time: all of them, or a worker's where a
        small set's epochs have fewer batches than the workers asked for."""
        return self.layout(n_threads, n_batches).threads_each


def check_trainable(model):
    """ValueError where ``model`` was loaded from a file saved without its optimizer's state
    (its moments and step records): training on from zero moments would be neither its run
    nor a fresh one. A sharded model's optimizers live in its shards, always with their state."""
    optimizer = getattr(model, "optimizer_", None)
    if optimizer is not None and not optimizer.has_state:
        raise ValueError("this model was saved without its optimizer's state (save(..., "
                         "optimizer_state=False)): it predicts but cannot train on; fit it "
                         "afresh (resume=False), or load a file saved with that state")


def train(model, X, Y, end_epoch_index, eval_set, callback, steps=None, rows=None):
    """``_train`` with BLAS single-threaded for the whole run: the batched engine's and the
    dense network's products run between Numba's parallel loops, whose spinning threads an
    OpenBLAS pool would fight (on 2 cores, 8.6 ms a batch at 200k labels with one BLAS thread
    against 39.5 ms with two: bench/results/block_phases_blas_threads.log)."""
    check_trainable(model)
    with blas_single_thread():
        return _train(model, X, Y, end_epoch_index, eval_set, callback, steps, rows)


def callback_info(model, serial, epoch, n_batches, loss, act, rehashed, rebuilt, **extra):
    """What the callback gets after batch ``serial`` (of epoch ``epoch``)."""
    return dict(batch=serial, epoch=epoch,
                batch_in_epoch=(model.batch_in_epoch_ - 1) % n_batches
                if model.batch_in_epoch_ else n_batches - 1,
                samples=model.samples_, loss=loss, train_seconds=model.train_seconds_,
                active_mean=act, rehashed=rehashed, rebuilt=rebuilt, **extra)


def _train(model, X, Y, end_epoch_index, eval_set, callback, steps=None, rows=None):
    """Train ``model`` from its current position until ``end_epoch_index`` epochs are complete,
    its ``time_budget`` is spent (``model.budget_spent_``) or ``callback`` returns a true value
    (``model.stopped_``). ``steps``: the model's batch steps (``NetworkSteps`` by default).
    ``rows``: train on these rows of (X, Y) only (sorted int64; the re-ranker's held-out rows
    are left out this way, without a copy of X)."""
    steps = NetworkSteps(model) if steps is None else steps
    n_threads = model._threads()
    bs = int(model.batch_size)
    n = X.shape[0] if rows is None else rows.shape[0]
    n_batches = (n + bs - 1) // bs
    # the schedule spans ``epochs`` epochs (or up to end_epoch_index, if partial_fit goes on);
    # "auto" resolves from all of X's rows, as fit does (``planned_batches``)
    total_batches = max(resolve_epochs(model.epochs, X.shape[0], bs),
                        int(end_epoch_index)) * n_batches
    # take_rows: scipy's Y[rows] would cast all of Y's label ids to int64 first
    steps.start(X, Y if rows is None else take_rows(Y, rows), n_threads)
    model.stopped_ = False
    model.budget_spent_ = False
    in_flight = getattr(steps, "in_flight", lambda *a: None)(n_threads, n_batches, total_batches)
    if in_flight is not None:
        try:
            return _train_waves(model, X, Y, end_epoch_index, eval_set, callback, steps, rows,
                                in_flight, n_batches, total_batches)
        finally:
            in_flight.close()
    batch_threads = getattr(steps, "batch_threads", lambda t, n: t)(n_threads, n_batches)
    numba.set_num_threads(batch_threads)
    try:
        return _train_batches(model, X, Y, end_epoch_index, eval_set, callback, steps, rows,
                              n_batches, total_batches, batch_threads)
    finally:
        numba.set_num_threads(n_threads)


def _train_batches(model, X, Y, end_epoch_index, eval_set, callback, steps, rows, n_batches,
                   total_batches, n_threads):
    """``_train``'s loop with one batch at a time (each on ``n_threads`` threads)."""
    bs = int(model.batch_size)
    n = X.shape[0] if rows is None else rows.shape[0]
    budget = getattr(model, "time_budget", None)
    while model.epoch_ < end_epoch_index:
        epoch = model.epoch_
        t_epoch = time.perf_counter()
        for batch in iterate_minibatches(n, bs, model.seed_, epoch, model.batch_in_epoch_):
            batch_rows = batch if rows is None else rows[batch]
            if budget and model.train_seconds_ >= budget:
                # the budget is spent (before this batch; also when a fit resumes after it
                # was): the schedule has reached its end (time_done), so training ends here
                # like a finished run, weights synced
                model.budget_spent_ = True
                model.sync()
                return
            t0 = time.perf_counter()
            serial = model.batches_ + 1
            lr = scheduled_learning_rate(
                float(model.learning_rate), model.lr_schedule, model.warmup_batches, serial,
                total_batches, model.train_seconds_ / budget if budget else 0.0)
            done = steps.step(X, Y, batch_rows, serial, lr, n_threads)
            if done is None:
                break           # back at an earlier position: go on from there
            loss, act, extra = done
            if not math.isfinite(loss):
                raise DivergenceError(serial, epoch, loss)
            model.batches_ = serial
            model.samples_ += batch_rows.shape[0]
            rehashed, rebuilt = steps.after_step()
            model.train_seconds_ += time.perf_counter() - t0
            model.batch_in_epoch_ += 1
            if model.batch_in_epoch_ >= n_batches:
                model.epoch_ += 1
                model.batch_in_epoch_ = 0
                # the epoch's closing work runs before the callback: a run stopped on an
                # epoch's last batch (and resumed from its checkpoint) must have synced
                # there exactly like a run that went on, or the two part bitwise
                end_epoch(model, epoch, t_epoch, eval_set)
            if model.verbose >= 2 and serial % 100 == 0:
                print(f"batch {serial} epoch {epoch} loss {loss:.4f} active {act:.0f}")
            if callback is not None:
                info = callback_info(model, serial, epoch, n_batches, loss, act, rehashed,
                                     rebuilt, **extra)
                if callback(model, info):
                    model.stopped_ = True
                    return


def _train_waves(model, X, Y, end_epoch_index, eval_set, callback, steps, rows, in_flight,
                 n_batches, total_batches):
    """``_train``'s loop with several batches in flight (``slide.network.inflight``): the
    batches of an epoch in waves; between waves nothing is in flight, and there the loop
    does what ``_train`` does after every batch. The callback runs once a wave, as after the
    wave's last batch, with the wave's mean loss and active size and its number of batches
    (``batches``)."""
    bs = int(model.batch_size)
    n = X.shape[0] if rows is None else rows.shape[0]
    budget = getattr(model, "time_budget", None)
    while model.epoch_ < end_epoch_index:
        epoch = model.epoch_
        t_epoch = time.perf_counter()
        batches = list(iterate_minibatches(n, bs, model.seed_, epoch, model.batch_in_epoch_))
        lo = 0
        while lo < len(batches):
            if budget and model.train_seconds_ >= budget:
                model.budget_spent_ = True
                model.sync()
                return
            t0 = time.perf_counter()
            wave = []
            # the wave's size can change between waves (``WarmedInFlight``)
            for i, batch in enumerate(batches[lo:lo + in_flight.wave_size()]):
                serial = model.batches_ + 1 + i
                lr = scheduled_learning_rate(
                    float(model.learning_rate), model.lr_schedule, model.warmup_batches,
                    serial, total_batches, model.train_seconds_ / budget if budget else 0.0)
                wave.append((batch if rows is None else rows[batch], serial, lr))
            results = in_flight.run_wave(X, Y, wave, model.seed_,
                                         getattr(model, "optimizer_", None))
            if results is None:
                break           # back at an earlier position: go on from there
            lo += len(wave)
            for (batch_rows, serial, _), (loss, _) in zip(wave, results):
                if not math.isfinite(loss):
                    # the wave's other batches were applied; the gradient buffers the
                    # diverged one filled are cleared (``Network.train_batch``)
                    model.network_.clear_gradients()
                    raise DivergenceError(serial, epoch, loss)
            rehashed = rebuilt = False
            for batch_rows, serial, _ in wave:
                model.batches_ = serial
                model.samples_ += batch_rows.shape[0]
                r1, r2 = steps.after_step()
                rehashed, rebuilt = rehashed or r1, rebuilt or r2
            model.train_seconds_ += time.perf_counter() - t0
            model.batch_in_epoch_ += len(wave)
            if model.batch_in_epoch_ >= n_batches:
                model.epoch_ += 1
                model.batch_in_epoch_ = 0
                end_epoch(model, epoch, t_epoch, eval_set)
            loss = float(np.mean([loss for loss, _ in results]))
            act = float(np.mean([active for _, active in results]))
            if model.verbose >= 2 and serial // 100 > (serial - len(wave)) // 100:
                print(f"batch {serial} epoch {epoch} loss {loss:.4f} active {act:.0f}")
            if callback is not None:
                info = callback_info(model, serial, epoch, n_batches, loss, act, rehashed,
                                     rebuilt, batches=len(wave))
                if callback(model, info):
                    model.stopped_ = True
                    return
