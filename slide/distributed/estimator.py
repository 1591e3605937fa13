"""``ShardedSlideClassifier``: ``SlideClassifier``'s API over a label-sharded output layer.

The driver (this object) holds the hidden layer and runs the batch loop; each shard (an
``OutputShard``, in a Ray actor or in process) holds the output rows of one contiguous label
range. One shard at the same seed draws and initialises exactly what the single-process
engine does (tests/test_distributed.py); S shards train the same algorithm with a global
softmax over the union of the shards' active sets.

Supported: one hidden layer, softmax loss, the output layer sampled (``sparse_layers`` None)
or dense (``sampler="dense"``), every sampler, optimizer and schedule of ``SlideClassifier``,
and its ``time_budget`` (the batch loop is ``slide.trainer.train``'s).
"""
import numpy as np

from slide import trainer
from slide.estimator import SlideClassifier
from slide.labels import names_of
from slide.params import check_k, is_int
from slide.trainer import blas_single_thread

BACKENDS = ("ray", "local")
SHARD_CONFIG_KEYS = ("sampler", "hash_family", "K", "L", "range_pow", "bucket_size",
                     "bucket_policy", "sampler_budget", "sampler_threshold", "min_active",
                     "shared_negatives", "exact_head", "sampling_correction", "negative_power", "optimizer",
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
    Every other keyword: ``SlideClassifier``.
    """

    _BUILT_ATTR = "hidden_"      # the driver's hidden layer, set by _build

    _extra_params = ("n_shards", "ray_address", "backend", "shard_cpus", "shard_memory_cap")

    def __init__(self, n_shards=4, ray_address=None, backend="ray", shard_cpus=1,
                 shard_memory_cap=None, **params):
        super().__init__(**params)
        self.n_shards = n_shards
        self.ray_address = ray_address
        self.backend = backend
        self.shard_cpus = shard_cpus
        self.shard_memory_cap = shard_memory_cap

    @classmethod
    def _get_param_names(cls):
        return sorted(set(SlideClassifier._get_param_names()) | set(cls._extra_params))

    # -- validation ----------------------------------------------------------------------------
    def _checked_params(self):
        hs, sparse = super()._checked_params()
        if len(hs) != 1:
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
        if self.ray_address is not None and not isinstance(self.ray_address, str):
            raise ValueError(f"ray_address must be None, 'auto' or 'host:port', got "
                             f"{self.ray_address!r}")
        return hs, sparse

    def _warm_up(self, X=None, Y=None):
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
            from slide.distributed.backend import LocalBackend
            return LocalBackend()
        from slide.distributed.ray_backend import RayBackend
        # each actor runs its kernels on the shard_cpus threads Ray reserved for it
        return RayBackend(self.ray_address, int(self.shard_cpus), self.shard_memory_cap)

    def _build(self, n_features, n_labels, hs, sparse, seed=None, shard_files=None):
        from slide.distributed.driver import HiddenLayer
        from slide.distributed.shard import shard_ranges
        from slide.schedule import RehashSchedule
        ranges = shard_ranges(n_labels, self.n_shards)   # ValueError: more shards than labels
        self._set_identity(n_features, n_labels, seed)
        self.hidden_sizes_ = tuple(int(h) for h in hs)
        self.sparse_layers_ = tuple(sparse)
        self.hidden_ = HiddenLayer(n_features, hs[0], self.seed_, self.optimizer,
                                   self.learning_rate, self.beta1, self.beta2, self.epsilon)
        self.bounds_ = np.array([lo for lo, _ in ranges] + [ranges[-1][1]], np.int64)
        self.schedule_ = RehashSchedule(self.rehash_period, self.rebuild_period,
                                        self.rehash_decay)
        self._set_position(batches=0, samples=0, epoch=0, batch_in_epoch=0, train_seconds=0.0,
                           history=[])
        self.bytes_per_batch_ = 0.0
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
        # the loop is SlideClassifier's (slide.trainer.train); only the batch step differs
        trainer.train(self, X, Y, end_epoch_index, eval_set, callback, steps=_ShardSteps(self),
                      rows=rows)

    def _n_held(self, n_rows, n_labels):
        # no re-ranker across shards (yet): the fixed blend of the vote, on every row
        return 0

    def _recover(self, exc, Y, n_threads):
        """A shard actor died (Ray restarted it empty): every shard and the driver go back to
        the last checkpoint, losing the batches since."""
        from slide.distributed.checkpoint import read_manifest, restore_driver
        import os
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

    # -- inference -----------------------------------------------------------------------------
    def _check_fitted(self):
        if not hasattr(self, "hidden_"):
            from sklearn.exceptions import NotFittedError
            raise NotFittedError("this ShardedSlideClassifier is not fitted yet; call fit first")
        if getattr(self, "backend_", None) is None:
            raise RuntimeError("this ShardedSlideClassifier was closed (its shard actors are "
                               "gone); load it again from a checkpoint")

    def sync(self):
        self._check_fitted()
        self.hidden_.sync()
        self.backend_.call_all("sync")
        return self

    def _hidden_all(self, X):
        return self.hidden_.forward(X, np.arange(X.shape[0], dtype=np.int64))

    # -- the neighbour vote (slide.neighbours): the memory lives in the driver, beside the hidden
    # layer; the shards give their top-k and log-sum-exp parts and the voted labels' logits
    def _build_memory(self, X, Y, split=None):
        """(``fit_neighbours``, ``fit``) the memory of the labelled rows, kept by the driver
        (``split`` is always None: no re-ranker here)."""
        from slide.neighbours import NeighbourMemory
        self._threads()
        self._fix_vote_settings()
        self.sync()
        self.memory_ = NeighbourMemory.build(self._hidden_all(X), Y, copy=False)

    def _neighbour_vote(self, neighbours=None):
        k = self.neighbours_ if neighbours is None else int(neighbours)
        if k <= 0 or getattr(self, "memory_", None) is None:
            return None
        return int(k), float(self.neighbour_weight_)

    def _merge_parts(self, parts, k):
        """The shards' best-first (scores, global ids) lists merged into the global top-k:
        (ids, scores), the scores as the shards gave them."""
        scores = np.concatenate([p[0] for p in parts], axis=1)
        ids = np.concatenate([p[1] for p in parts], axis=1)
        order = np.argsort(-scores, axis=1, kind="stable")[:, :min(int(k), self.n_labels_)]
        return (np.take_along_axis(ids, order, axis=1),
                np.take_along_axis(scores, order, axis=1))

    def _blended_topk(self, H, k, n_neighbours, weight):
        """(ids, blended scores) of the exact top-k with the vote, over every shard."""
        from slide.neighbours import blend_block
        parts = self.backend_.call_all("topk_lse", H, k)
        top_ids, top_z = self._merge_parts(parts, k)
        m = np.max([p[2] for p in parts], axis=0)
        lse = m + np.log(sum(p[3] * np.exp(p[2] - m) for p in parts))
        V = self.memory_.vote(H, n_neighbours)
        rows = np.repeat(np.arange(H.shape[0]), np.diff(V.indptr))
        labels = V.indices.astype(np.int64)
        v_z = np.zeros(V.nnz, np.float64)
        masks = [(labels >= lo) & (labels < hi)
                 for lo, hi in zip(self.bounds_[:-1], self.bounds_[1:])]
        got = self.backend_.call_each("logits_at", [(H, rows[q], labels[q]) for q in masks])
        for q, vals in zip(masks, got):
            v_z[q] = vals
        return blend_block(top_ids, top_z, lse, V, v_z, weight, False, top_ids.shape[1])

    def predict_topk_scored(self, X, k=5, *, neighbours=None, rerank=None):
        """As ``SlideClassifier.predict_topk_scored`` (no re-ranker across shards: ``rerank``
        is checked and unused)."""
        self._check_switches(neighbours, rerank)
        X = self._check_predict_args(X, k)
        with blas_single_thread():
            H = self._hidden_all(X)
            vote = self._neighbour_vote(neighbours)
            if vote is not None:
                return self._blended_topk(H, int(k), *vote)
            ids, scores = self._merge_parts(self.backend_.call_all("topk_exact", H, int(k)), k)
        return ids, scores.astype(np.float64)

    def predict_proba(self, X, *, neighbours=None):
        """As ``SlideClassifier.predict_proba`` (every shard's logits gathered: dense)."""
        from slide.neighbours import add_vote, probabilities
        self._check_switches(neighbours, None)
        X = self._prepare_inference(X)
        with blas_single_thread():
            H = self._hidden_all(X)
            p = probabilities(np.concatenate(self.backend_.call_all("scores", H), axis=1),
                              False)
        vote = self._neighbour_vote(neighbours)
        if vote is not None:
            add_vote(p, self.memory_.vote(H, vote[0]), vote[1])
        return p.astype(np.float32)

    def predict_topk(self, X, k=5, exact=True, prior_candidates=None, *, neighbours=None,
                     rerank=None, return_names=False):
        """As ``SlideClassifier.predict_topk``: each shard returns its local top-k with scores,
        the driver merges them (exact, with the neighbour vote: each shard's top-k and
        log-sum-exp parts, the voted labels' logits, blended in the driver). Sparse
        (``exact=False``, the network alone): each shard's serving index (built from its
        weights on first use, whatever the sampler) plus the ``prior_candidates``
        highest biases over ALL shards (None: ``slide.lsh.serving.default_prior`` of the
        label count, as in the single process; the driver picks them from each shard's own
        best)."""
        from slide.lsh.serving import default_prior
        self._check_fitted()
        check_k(k, self.n_labels_)
        self._check_switches(neighbours, rerank)
        if prior_candidates is None:
            prior_candidates = default_prior(self.n_labels_)
        if not is_int(prior_candidates) or prior_candidates < 0:
            raise ValueError(f"prior_candidates must be a non-negative integer or None, "
                             f"got {prior_candidates!r}")
        X = self._check_data(X, fitted=True)
        self._threads()
        self.sync()
        k = int(k)
        with blas_single_thread():
            H = self._hidden_all(X)
            vote = self._neighbour_vote(neighbours)
            if exact and vote is not None:
                ids = self._blended_topk(H, k, *vote)[0]
                return names_of(self, ids) if return_names else ids
            if exact:
                parts = self.backend_.call_all("topk_exact", H, k)
            else:
                prior = self._global_prior(int(prior_candidates))
                parts = self.backend_.call_each(
                    "topk_sparse", [(H, k, prior[(prior >= lo) & (prior < hi)])
                                    for lo, hi in zip(self.bounds_[:-1], self.bounds_[1:])])
        ids = self._merge_parts(parts, k)[0]
        return names_of(self, ids) if return_names else ids

    def _global_prior(self, n):
        if n == 0:
            return np.zeros(0, np.int64)
        parts = self.backend_.call_all("prior_scores", n)
        b = np.concatenate([p[0] for p in parts])
        ids = np.concatenate([p[1] for p in parts])
        n = min(n, b.shape[0])
        return np.sort(ids[np.argsort(-b, kind="stable")[:n]])

    def predict_scores(self, X):
        X = self._prepare_inference(X)
        with blas_single_thread():
            return np.concatenate(self.backend_.call_all("scores", self._hidden_all(X)), axis=1)

    # -- checkpoints ---------------------------------------------------------------------------
    def save(self, path, extra=None):
        """A checkpoint directory: one file per shard, then the driver's file, then the
        manifest (written last: a directory without it is not a checkpoint)."""
        from slide.distributed.checkpoint import save
        self._check_fitted()
        save(self, path, extra)

    def sample_loss_and_grads(self, *args, **kwargs):
        raise NotImplementedError("sample_loss_and_grads is not available on a sharded model")

    def __del__(self):
        try:
            self._close_backend()
        except Exception:   # pragma: no cover - interpreter shutdown
            pass


class _ShardSteps:
    """``slide.trainer.train``'s batch steps for a sharded model: the driver trains the hidden
    layer, the shards their slices of the output layer (``slide.distributed.driver``)."""

    def __init__(self, model):
        self.model = model

    def start(self, X, Y, n_threads):
        self.model._prepare_shards(Y, n_threads)
        self.model.memory_ = None   # the neighbour memory was built from weights this changes

    def step(self, X, Y, rows, serial, lr, n_threads):
        from slide.distributed.driver import train_batch
        from slide.distributed.ray_backend import ShardFailure
        m = self.model
        try:
            loss, sent, act = train_batch(m.hidden_, m.backend_, m.bounds_, X, Y, rows, serial,
                                          lr, n_threads)
        except ShardFailure as exc:
            m._recover(exc, Y, n_threads)
            return None         # go on from the checkpoint's position
        m.bytes_per_batch_ = sent
        return loss, act, {"bytes_sent": sent}

    def after_step(self):
        m = self.model
        # the shards rehash on their own schedules, all equal to this copy of it
        if m.sampler in ("random", "dense"):
            return False, False
        return m.schedule_.step(m.batches_)
