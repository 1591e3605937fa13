"""``ShardedSlideClassifier``: ``SlideClassifier``'s API over a label-sharded output layer.

The driver (this object) holds the hidden layer and runs the batch loop; each shard (an
``OutputShard``, in a Ray actor or in process) holds the output rows of one contiguous label
range. One shard at the same seed draws and initialises exactly what the single-process
engine does (tests/test_distributed.py); S shards train the same algorithm with a global
softmax over the union of the shards' active sets.

Supported: one hidden layer, softmax loss, the output layer sampled (``sparse_layers`` None)
or dense (``sampler="dense"``), every sampler, optimizer and schedule of ``SlideClassifier``,
and its ``time_budget`` (the batch loop is ``slide.network.trainer.train``'s).
"""
import os
import weakref

import numpy as np
from sklearn.exceptions import NotFittedError

from slide.distributed.backend import LocalBackend, SimulatedLatency
from slide.distributed.checkpoint import load_directory, read_manifest, restore_driver, save
from slide.distributed.driver import HiddenLayer, train_batch
from slide.distributed.pipeline import GRAPH_IN_FLIGHT, ShardPipeline, check_pipeline_depth
from slide.distributed.ray_backend import RayBackend, ShardFailure
from slide.distributed.shard import shard_ranges
from slide.estimator import SlideClassifier
from slide.kernels.topk import probabilities
from slide.network import trainer
from slide.network.schedule import RehashSchedule
from slide.params import hidden_layer_count, is_int, is_real
from slide.rank.stack import RankStack


BACKENDS = ("ray", "local")
SHARD_CONFIG_KEYS = ("sampler", "hash_family", "K", "L", "range_pow", "bucket_size",
                     "bucket_policy", "sampler_budget", "sampler_threshold", "min_active",
                     "shared_negatives", "exact_head", "sampling_correction", "negative_power",
                     "optimizer",
                     "learning_rate", "beta1", "beta2", "epsilon", "rehash_period",
                     "rebuild_period", "rehash_decay")


class ShardedSlideClassifier(SlideClassifier):
    """``SlideClassifier`` with its output layer split by label over ``n_shards`` shards.

    n_shards : int, 1 <= n_shards <= number of labels
    ray_address : None (start or join a local Ray), "auto" or "host:port" (an existing cluster)
    backend : "ray" (one actor per shard) | "local" (the shards in this process)
    shard_cpus : CPUs reserved per shard actor (Ray ``num_cpus``), and its Numba threads
    shard_memory_cap : None, or bytes: each shard actor's data-segment limit
        (``resource.setrlimit(RLIMIT_DATA)``: heap and private mappings, where the shard's
        arrays live), to show a model that does not fit one process
    simulated_latency_ms : float >= 0; every message between the driver and the shards is
        delayed this long each way (``backend.SimulatedLatency``), to measure on one machine
        what a cluster's network costs; 0 (the default): no delay
    pipeline_depth : int >= 1, batches in flight between the driver and the shards
        (``slide.distributed.pipeline``): 1, the synchronous loop (two round trips a batch,
        the same steps as one process); d >= 2, one message a batch and d - 1 of them in
        flight, the hidden layer's input to the shards up to 2 d - 3 batches stale
    Every other keyword: ``SlideClassifier``.
    """

    _BUILT_ATTR = "hidden_"      # the driver's hidden layer, set by _build

    _extra_params = ("n_shards", "ray_address", "backend", "shard_cpus", "shard_memory_cap",
                     "simulated_latency_ms", "pipeline_depth")

    def __init__(self, n_shards=4, ray_address=None, backend="ray", shard_cpus=1,
                 shard_memory_cap=None, simulated_latency_ms=0.0, pipeline_depth=1, **params):
        super().__init__(**params)
        self.n_shards = n_shards
        self.ray_address = ray_address
        self.backend = backend
        self.shard_cpus = shard_cpus
        self.shard_memory_cap = shard_memory_cap
        self.simulated_latency_ms = simulated_latency_ms
        self.pipeline_depth = pipeline_depth

    @classmethod
    def _get_param_names(cls):
        return sorted(set(SlideClassifier._get_param_names()) | set(cls._extra_params))

    # -- validation ----------------------------------------------------------------------------
    def _checked_params(self):
        hs, sparse = super()._checked_params()
        if hidden_layer_count(hs) != 1:
            raise ValueError(f"ShardedSlideClassifier supports exactly one hidden layer, got "
                             f"hidden_sizes={tuple(hs)!r}")
        if self.sampler != "dense" and sparse != (1,):
            raise ValueError(f"ShardedSlideClassifier samples the output layer only "
                             f"(sparse_layers None or (1,)), got {self.sparse_layers!r}")
        if self.loss != "softmax":
            raise ValueError(f"ShardedSlideClassifier supports loss='softmax' only, got "
                             f"{self.loss!r}")
        if not is_int(self.n_shards) or self.n_shards < 1:
            raise ValueError(f"n_shards must be a positive integer, got {self.n_shards!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if not is_int(self.shard_cpus) or self.shard_cpus < 1:
            raise ValueError(f"shard_cpus must be a positive integer, got {self.shard_cpus!r}")
        if not is_real(self.simulated_latency_ms) or not self.simulated_latency_ms >= 0:
            raise ValueError(f"simulated_latency_ms must be a number >= 0, got "
                             f"{self.simulated_latency_ms!r}")
        check_pipeline_depth(self.pipeline_depth)
        if self.ray_address is not None and not isinstance(self.ray_address, str):
            raise ValueError(f"ray_address must be None, 'auto' or 'host:port', got "
                             f"{self.ray_address!r}")
        return hs, sparse

    def _warm_up(self, X=None, Y=None, then=()):
        # no throw-away warm-up model: the shards compile in their own processes (Numba's
        # cache makes that a load after the first run); compile time is part of train_seconds_
        self._threads()
        return 0.0

    # -- building ------------------------------------------------------------------------------
    def shard_config(self):
        cfg = {k: getattr(self, k) for k in SHARD_CONFIG_KEYS}
        cfg["learning_rate"] = float(cfg["learning_rate"])
        cfg.update(seed=self.seed_, n_features=self.n_features_in_)
        return cfg

    def _make_backend(self):
        if self.backend == "local":
            backend = LocalBackend()
        else:
            # each actor runs its kernels on the shard_cpus threads Ray reserved for it
            backend = RayBackend(self.ray_address, int(self.shard_cpus), self.shard_memory_cap)
        # absent from models pickled before it
        latency = getattr(self, "simulated_latency_ms", 0.0)
        return SimulatedLatency(backend, latency) if latency else backend

    def _build(self, n_features, n_labels, hs, sparse, seed=None, shard_files=None):
        ranges = shard_ranges(n_labels, self.n_shards)   # ValueError: more shards than labels
        self._set_identity(n_features, n_labels, seed)
        hs = trainer.resolve_hidden_sizes(hs, n_features, n_labels)
        self.hidden_sizes_ = hs
        self.sparse_layers_ = tuple(sparse)
        self.hidden_ = HiddenLayer(n_features, hs[0], self.seed_, self.optimizer,
                                   self.learning_rate, self.beta1, self.beta2, self.epsilon)
        self.bounds_ = np.array([lo for lo, _ in ranges] + [ranges[-1][1]], np.int64)
        self.schedule_ = RehashSchedule(self.rehash_period, self.rebuild_period,
                                        self.rehash_decay)
        self._set_position(batches=0, samples=0, epoch=0, batch_in_epoch=0, train_seconds=0.0,
                           history=[])
        self.bytes_per_batch_ = 0.0
        # what SlideClassifier's inference reads: the hidden layer and the shards' output
        # layer behind Network's query methods, and the neighbour vote's memory in the driver
        self.network_ = ShardedNetwork(self)
        self.rank_ = RankStack()
        cfg = self.shard_config()
        specs = [dict(q=q, lo=lo, hi=hi, n_hidden=hs[0], n_labels=n_labels, config=cfg)
                 for q, (lo, hi) in enumerate(ranges)]
        self._close_backend()
        self.backend_ = self._make_backend().create(specs, shard_files)

    def close(self):
        """Stop the shard actors (their CPUs go back to the Ray cluster). The model cannot
        predict or train afterwards; save it first if it is still needed."""
        self._close_backend()

    def _close_backend(self):
        b = getattr(self, "backend_", None)
        if b is not None:
            b.shutdown()
            self.backend_ = None

    # -- training ------------------------------------------------------------------------------
    def _train(self, X, Y, end_epoch_index, eval_set, callback, rows=None):
        # the loop is SlideClassifier's (slide.network.trainer.train); only the batch step differs
        trainer.train(self, X, Y, end_epoch_index, eval_set, callback, steps=_ShardSteps(self),
                      rows=rows)

    def _n_held(self, n_rows, n_labels):
        # no re-ranker across shards (yet): the fixed blend of the vote, on every row
        return 0

    def _recover(self, exc, Y, n_threads):
        """A shard actor died (Ray restarted it empty): every shard and the driver go back to
        the last checkpoint, losing the batches since."""
        path = getattr(self, "last_checkpoint_", None)
        if path is None:
            raise RuntimeError(f"{exc}; no checkpoint to resume from (save one with "
                               f"model.save(dir), e.g. from the fit callback)") from exc
        man = read_manifest(path)
        self.backend_.reload([os.path.join(path, f) for f in man["shards"]])
        restore_driver(self, path, man)
        self._prepare_shards(Y, n_threads)
        self.recoveries_ = getattr(self, "recoveries_", 0) + 1

    def _prepare_shards(self, Y, n_threads):
        n = Y.shape[0]
        counts = np.bincount(Y.indices, minlength=Y.shape[1])
        max_labels = int(np.diff(Y.indptr).max()) if n else 1
        log_prior = self.batches_ == 0 and self.output_bias_init == "log_prior" and n > 0
        args = [(int(self.batch_size), n_threads, max_labels, counts[lo:hi], n, log_prior)
                for lo, hi in zip(self.bounds_[:-1], self.bounds_[1:])]
        self.backend_.call_each("prepare", args)
        # the messages through Ray's compiled graph (``RayBackend.compile_graph``): once, and
        # again after a failure tore it down (a no-op while it stands)
        self.backend_.compile_graph("step", max(GRAPH_IN_FLIGHT,
                                                getattr(self, "pipeline_depth", 1)))

    # -- inference -----------------------------------------------------------------------------
    def _check_fitted(self):
        if not hasattr(self, "hidden_"):
            raise NotFittedError("this ShardedSlideClassifier is not fitted yet; call fit first")
        if getattr(self, "backend_", None) is None:
            raise RuntimeError("this ShardedSlideClassifier was closed (its shard actors are "
                               "gone); load it again from a checkpoint")

    def sync(self):
        self._check_fitted()
        self.hidden_.sync()
        self.backend_.call_all("sync")
        return self

    # -- checkpoints ---------------------------------------------------------------------------
    def save(self, path, extra=None, optimizer_state=True):
        """A checkpoint directory: one file per shard, then the driver's file, then the
        manifest (written last: a directory without it is not a checkpoint). It always holds
        the optimizers' state (``optimizer_state=False`` is refused: ``to_single`` first)."""
        self._check_fitted()
        if not optimizer_state:
            raise ValueError("a sharded model's checkpoint keeps its shards' optimizer state; "
                             "to save one without it, convert it to one process's model "
                             "(slide.distributed.convert.to_single) and save that")
        save(self, path, extra)

    @classmethod
    def _load_directory(cls, path):
        """The model of the checkpoint directory ``path`` (unpickling: ``slide.persist.
        pickling``), its shards on the saved backend."""
        return load_directory(path, cls)

    def _adopt_state(self):
        # the query view holds a weak reference to its model: unpickling copied it from the
        # loaded one, which is gone
        self.network_ = ShardedNetwork(self)

    def sample_loss_and_grads(self, *args, **kwargs):
        raise NotImplementedError("sample_loss_and_grads is not available on a sharded model")

    def __del__(self):
        try:
            self._close_backend()
        except Exception:   # pragma: no cover - interpreter shutdown
            pass


def merge_parts(parts, k, n_labels):
    """The shards' best-first (scores, global ids) lists merged into the global top-k:
    (ids, scores), the scores as the shards gave them."""
    scores = np.concatenate([p[0] for p in parts], axis=1)
    ids = np.concatenate([p[1] for p in parts], axis=1)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :min(int(k), n_labels)]
    return (np.take_along_axis(ids, order, axis=1),
            np.take_along_axis(scores, order, axis=1))


class ShardedNetwork:
    """A sharded model's network as ``SlideClassifier``'s fit and inference read it (the
    query methods of ``slide.network.Network``): the driver's hidden layer (``hidden_``) and
    the shards' slices of the output layer (``backend_``, label ranges ``bounds_``). Exact
    top-k: each shard's local top-k with scores, merged in the driver; serving top-k: each
    shard's serving index plus the highest biases over all shards."""

    def __init__(self, model):
        # a weak reference: no cycle, so a dropped model is freed (and its actors stopped by
        # ``__del__``) at once, as before the model held this object
        self._model = weakref.ref(model)

    @property
    def model(self):
        return self._model()

    def hidden(self, X):
        return self.model.hidden_.forward(X, np.arange(X.shape[0], dtype=np.int64))

    def output_layer(self):
        return ShardedOutput(self.model)

    def release_scratch(self):
        """Nothing to release in the driver (each shard keeps its own scratch)."""

    def clear_gradients(self):
        """Drop the bias gradient a diverged batch may have left (the pipeline stops before
        the hidden layer's step of a batch whose loss is not finite)."""
        self.model.hidden_.GB[:] = 0.0

    def predict_topk_exact(self, X, k, with_scores=False):
        m = self.model
        ids, scores = merge_parts(m.backend_.call_all("topk_exact", self.hidden(X), int(k)), k,
                                  m.n_labels_)
        return (ids, scores.astype(np.float64)) if with_scores else ids

    def predict_topk_serving(self, X, k, prior_candidates=0):
        """Each shard's serving index (built from its weights on first use, whatever the
        sampler) plus the ``prior_candidates`` highest biases over ALL shards (the driver
        picks them from each shard's own best)."""
        m = self.model
        H = self.hidden(X)
        prior = self._global_prior(int(prior_candidates))
        parts = m.backend_.call_each(
            "topk_sparse", [(H, int(k), prior[(prior >= lo) & (prior < hi)])
                            for lo, hi in zip(m.bounds_[:-1], m.bounds_[1:])])
        return merge_parts(parts, k, m.n_labels_)[0]

    def _global_prior(self, n):
        if n == 0:
            return np.zeros(0, np.int64)
        parts = self.model.backend_.call_all("prior_scores", n)
        b = np.concatenate([p[0] for p in parts])
        ids = np.concatenate([p[1] for p in parts])
        n = min(n, b.shape[0])
        return np.sort(ids[np.argsort(-b, kind="stable")[:n]])

    def predict_scores(self, X):
        return ShardedOutput(self.model).logits(self.hidden(X))

    def predict_proba(self, X):
        """Softmax of every shard's logits, gathered (dense)."""
        return probabilities(self.predict_scores(X), False).astype(np.float32)


class ShardedOutput:
    """The sharded output layer as the ranking stages read it (``slide.rank.output``'s
    questions, answered by the shards): each shard's top-k and log-sum-exp parts merged in
    the driver, the logits of given (row, label) pairs asked of the shards that hold them.
    Softmax only (``ShardedSlideClassifier`` supports no other loss)."""

    sigmoid = False

    def __init__(self, model):
        self.model = model

    @property
    def n_labels(self):
        return self.model.n_labels_

    def topk_lse(self, H, k):
        parts = self.model.backend_.call_all("topk_lse", H, k)
        top_ids, top_z = merge_parts(parts, k, self.model.n_labels_)
        m = np.max([p[2] for p in parts], axis=0)
        lse = m + np.log(sum(p[3] * np.exp(p[2] - m) for p in parts))
        return top_ids, top_z, lse

    def logits_at(self, H, V):
        rows = np.repeat(np.arange(H.shape[0]), np.diff(V.indptr))
        labels = V.indices.astype(np.int64)
        v_z = np.zeros(V.nnz, np.float64)
        bounds = self.model.bounds_
        masks = [(labels >= lo) & (labels < hi) for lo, hi in zip(bounds[:-1], bounds[1:])]
        got = self.model.backend_.call_each("logits_at",
                                            [(H, rows[q], labels[q]) for q in masks])
        for q, vals in zip(masks, got):
            v_z[q] = vals
        return v_z

    def logits(self, H):
        return np.concatenate(self.model.backend_.call_all("scores", H), axis=1)


class _ShardSteps:
    """``slide.network.trainer.train``'s batch steps for a sharded model: the driver trains
    the hidden layer, the shards their slices of the output layer
    (``slide.distributed.driver``)."""

    def __init__(self, model):
        self.model = model

    def start(self, X, Y, n_threads):
        self.model._prepare_shards(Y, n_threads)
        self.model.rank_.clear()    # the neighbour memory was built from weights this changes

    def step(self, X, Y, rows, serial, lr, n_threads):
        m = self.model
        try:
            loss, sent, act = train_batch(m.hidden_, m.backend_, m.bounds_, X, Y, rows, serial,
                                          lr)
        except ShardFailure as exc:
            m._recover(exc, Y, n_threads)
            return None         # go on from the checkpoint's position
        m.bytes_per_batch_ = sent
        return loss, act, {"bytes_sent": sent}

    def in_flight(self, n_threads, n_batches, total_batches=None):
        """The pipeline (``slide.distributed.pipeline``) of a model whose pipeline_depth is 2
        or more, else None (the synchronous loop, ``step``)."""
        # absent from models pickled before it
        depth = getattr(self.model, "pipeline_depth", 1)
        return ShardPipeline(self.model, depth, n_threads) if depth > 1 else None

    def after_step(self):
        m = self.model
        # the shards rehash on their own schedules, all equal to this copy of it
        if m.sampler in ("random", "dense"):
            return False, False
        return m.schedule_.step(m.batches_)
