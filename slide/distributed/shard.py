"""``OutputShard``: the rows of labels [lo, hi) of a sharded output layer, with their own LSH
index and rehash schedule, shared negatives over the local label counts, and sparse Adam
state. Pure Python + Numba, no Ray: the Ray backend wraps one per actor, the local backend
drives them in process (tests, debugging).

Protocol of a training batch (``slide.distributed.driver``, ``slide.distributed.pipeline``),
through ``step(backward, forward)``, one message that may carry either half or both:
  forward = (serial, H, lab_ptr, lab_ind)  -> stats [5, nb]: per sample the max and the sum of
      exp over the shard's corrected active logits, the sum of its label logits, the number of
      its labels found, its number of active outputs; the batch stays in flight;
  backward = (serial, log_z, n_labels, lr) -> dH [nb, hidden]: the shard's share of dL/dh,
      after updating its touched rows (and rehashing on its own schedule).
A shard trains as the batched engine does: its shared negatives' rows as three BLAS products
for the batch, the rest per sample (``slide.distributed.kernels``).
"""
from typing import NamedTuple

import numpy as np
from threadpoolctl import threadpool_limits

from slide.distributed.checkpoint import read_part, write_part
from slide.distributed.kernels import (OUT, ShardForward, ShardScratch, init_rows_like_global,
                                       shard_backward_kernel, shard_forward_kernel)
from slide.kernels.arrays import Csr, Store
from slide.kernels.negatives import head_size
from slide.kernels.rng import STREAM_SHARD_SEED, derived_seed, init_stream
from slide.kernels.topk import topk_lse_of_logits, topk_of_logits
from slide.kernels.touched import output_entries
from slide.network import Network
from slide.network.block import block_offsets
from slide.network.optim import SparseOptimizer
from slide.network.schedule import RehashSchedule
from slide.persist.checkpoint import CheckpointError


def shard_ranges(n_labels, n_shards):
    """Contiguous label ranges [lo, hi) of ``n_shards`` shards, sizes differing by at most 1."""
    n_labels, n_shards = int(n_labels), int(n_shards)
    if n_shards < 1 or n_shards > n_labels:
        raise ValueError(f"n_shards must be between 1 and the number of labels ({n_labels}), "
                         f"got {n_shards}")
    b = [(q * n_labels) // n_shards for q in range(n_shards + 1)]
    return [(b[q], b[q + 1]) for q in range(n_shards)]


def shard_seed(seed, q):
    """Shard 0 uses the model's seed (one shard then draws what the single process draws)."""
    return int(seed) if q == 0 else int(derived_seed(int(seed), STREAM_SHARD_SEED, q))


def _share(total, n_local, n_labels):
    """A per-sample or per-batch budget split in proportion to the shard's label count."""
    total = int(total)
    return 0 if total == 0 else max(1, -(-total * int(n_local) // int(n_labels)))


class SampleBuffers(NamedTuple):
    """A batch's per-sample rows that ``ShardForward`` views (its first nb rows), pooled
    between batches."""
    extra: np.ndarray        # [batch, cap] int32: each sample's extras' label ids
    n_extra: np.ndarray      # [batch, 1] int64: how many
    dx: np.ndarray           # [batch, cap] float32: their logits, then deltas
    slots: np.ndarray        # [batch, cap] int32: where each label found sits


class InFlight(NamedTuple):
    """A batch between its forward and its backward pass on this shard."""
    forward: object          # its ``ShardForward`` (H, the rows of S as read, Z, ...)
    shared: np.ndarray       # its shared negatives S
    buffers: SampleBuffers   # its pooled per-sample buffers, freed after the backward pass


class OutputShard:
    """Output rows of labels [lo, hi) of a network whose last hidden layer has ``n_hidden``
    units and whose output layer has ``n_labels`` neurons. ``config``: the model's settings
    (``ShardedSlideClassifier.shard_config``): sampler, LSH, min_active, shared_negatives,
    negative_power, sampling_correction, optimizer, beta1/2, epsilon, rehash schedule, seed,
    n_features (for the single-process initialisation of the rows)."""

    def __init__(self, q, lo, hi, n_hidden, n_labels, config, init=True):
        self.q, self.lo, self.hi = int(q), int(lo), int(hi)
        self.n_local = self.hi - self.lo
        self.n_hidden, self.n_labels = int(n_hidden), int(n_labels)
        self.config = cfg = dict(config)
        self.seed = shard_seed(cfg["seed"], self.q)
        sampler = cfg["sampler"]
        if sampler == "dense":       # every row active: the exact full softmax, no LSH
            sampler, min_act, n_shared = "random", self.n_local, 0
        else:
            min_act = _share(cfg["min_active"], self.n_local, n_labels)
            n_shared = _share(cfg["shared_negatives"], self.n_local, n_labels)
        lsh = None
        if sampler != "random":
            lsh = dict(sampler=sampler, family=cfg["hash_family"], K=int(cfg["K"]),
                       L=int(cfg["L"]), range_pow=int(cfg["range_pow"]),
                       bucket_size=int(cfg["bucket_size"]), policy=cfg["bucket_policy"],
                       budget=_share(cfg["sampler_budget"], self.n_local, n_labels),
                       threshold=int(cfg["sampler_threshold"]))
        self.net = Network((1, self.n_hidden, self.n_local), [False, True], [0, min_act],
                           seed=self.seed, lsh=lsh, init=False, shared_negatives=n_shared,
                           shared_head=head_size(n_shared, cfg.get("exact_head", 0.0)),
                           correct=bool(cfg["sampling_correction"]),
                           negative_power=float(cfg["negative_power"]),
                           # a shard runs its own kernels (slide.distributed.kernels): no
                           # batched-engine buffers
                           engine="per_sample")
        self.opt = SparseOptimizer(cfg["optimizer"], self.net.layout, cfg["learning_rate"],
                                   cfg["beta1"], cfg["beta2"], cfg["epsilon"])
        self.schedule = RehashSchedule(cfg["rehash_period"], cfg["rebuild_period"],
                                       cfg["rehash_decay"])
        if init:
            self._init_rows()

    def _init_rows(self):
        """The single-process initial weights of rows [lo, hi) (zero biases)."""
        n_f, h = int(self.config["n_features"]), self.n_hidden
        W, _ = self.net.output_view()
        std = np.sqrt(2.0 / (h + self.n_labels))
        init_rows_like_global(W.reshape(-1), n_f * h, n_f * h + self.lo * h, std,
                              np.uint64(self.config["seed"]), np.int64(init_stream(1)))

    # -- setup ---------------------------------------------------------------------------------
    def prepare(self, batch_size, n_chunks, max_labels, counts, n_samples, log_prior):
        """Scratch, local label counts (shared negatives), the log-prior biases (first batch
        only: ``log_prior``) and the LSH tables. Batches in flight from an earlier run (a
        pipeline broken by a failure) are dropped."""
        self.net.prepare(int(batch_size), int(n_chunks), max(1, int(max_labels)))
        cap = self.net.store.d_store.shape[1]
        n_chunks = self.net.sc.acts.shape[0]
        self._scratch = ShardScratch(np.zeros((n_chunks, cap), np.int64),
                                     np.zeros((n_chunks, cap), np.float32))
        self._in_flight = {}         # serial -> InFlight
        self._free = []              # buffers of finished batches
        counts = np.asarray(counts, np.float64)
        self.net.set_label_counts(counts)
        if log_prior:
            _, b = self.net.output_view()
            b[:] = np.log((counts + 1.0) / (int(n_samples) + self.n_labels))
        if self.net.uses_tables and not self.net.indices:
            self.net.build_indices()
        return True

    def _buffers(self):
        """A batch's per-sample buffers (``SampleBuffers``, rows for a whole batch): a finished
        batch's, or new ones while more batches are in flight than ever before."""
        if self._free:
            return self._free.pop()
        bs, cap = self.net.store.d_store.shape
        return SampleBuffers(np.zeros((bs, cap), np.int32), np.zeros((bs, 1), np.int64),
                             np.zeros((bs, cap), np.float32), np.zeros((bs, cap), np.int32))

    # -- training ------------------------------------------------------------------------------
    def forward(self, serial, H, lab_ptr, lab_ind):
        """Partial softmax statistics of batch ``serial`` (see the module docstring); the
        batch stays in flight until its ``backward``."""
        net = self.net
        # writable copies of what Ray hands over read-only: the kernels then compile once for
        # both backends (a read-only array is another type to Numba)
        H = np.require(H, np.float32, ["C", "W"])
        nb = H.shape[0]
        shared = net.negatives.draw(self.seed, serial)
        neg = net.negatives.bundle(shared)
        W, b = net.output_view()
        WS = W[shared]                       # a copy: the rows as this pass read them
        buf = self._buffers()
        # the batch's own (contiguous also for a short last batch): it travels to the driver
        stats = np.zeros((5, nb), np.float64)
        with np.errstate(over="ignore", invalid="ignore"):   # a diverging run: stats say NaN
            Z = H @ WS.T
        fw = ShardForward(H, WS, Z, buf.extra[:nb], buf.n_extra[:nb], buf.dx[:nb],
                          buf.slots[:nb], stats)
        labels = Csr(np.require(lab_ptr, np.int64, ["C", "W"]),
                     np.require(lab_ind, np.int32, ["C", "W"]), np.zeros(0, np.float32))
        shard_forward_kernel(net.params, net.spec, net.tables, net.sc, fw, labels,
                             np.uint64(self.seed), np.int64(serial), neg,
                             block_offsets(b[shared], shared, neg), net.correct,
                             self._scratch)
        self._in_flight[int(serial)] = InFlight(fw, shared, buf)
        self._active = float(stats[4].mean())
        return stats

    def backward(self, serial, log_z, n_labels, learning_rate):
        """Deltas of batch ``serial`` from the global normaliser, this shard's dL/dh, then the
        row update and the shard's rehash / rebuild when its schedule says so. Returns
        dH [nb, hidden]. dH is formed from the rows of S as the forward pass read them (with
        several batches in flight a later batch's update may have moved them since: the
        weight stashing of PipeDream, for the block)."""
        batch = self._in_flight.pop(int(serial))
        fw, shared, buf = batch.forward, batch.shared, batch.buffers
        net = self.net
        nb = fw.H.shape[0]
        net.serving = None          # built from weights this step changes
        dH = np.empty((nb, self.n_hidden), np.float32)
        shard_backward_kernel(net.W, np.int64(net.spec.w_off[OUT]), fw,
                              np.require(log_z, np.float64, ["C", "W"]),
                              np.require(n_labels, np.int64, ["C", "W"]), 1.0 / nb, dH)
        D = fw.Z
        dH += D @ fw.WS
        dWS = D.T @ fw.H
        dbS = D.sum(axis=0)
        # the extras' rows by the row path: h_store is the batch's H, d_store their deltas
        store = Store(fw.H, fw.dx)
        nu = output_entries(fw.extra, fw.n_extra, 0, fw.dx.shape[1], net.out_rows,
                            np.int64(serial))
        self.opt.learning_rate = float(learning_rate)
        self.opt.next_step()     # what the single-process optimizer.step does first
        self.opt.step_output_rows(net.W, net.B, (net.out_rows, nu, store),
                                  (shared, dWS, dbS, net.out_stamp, serial))
        self._free.append(buf)
        self._maybe_rehash(serial)
        return dH

    def step(self, backward, forward):
        """One message of the pipelined protocol (``slide.distributed.pipeline``): the
        backward pass of one batch, ``backward`` = (serial, log_z, n_labels, learning_rate),
        then the forward pass of a later one, ``forward`` = (serial, H, lab_ptr, lab_ind);
        either may be None. Returns (dH or None, stats or None)."""
        dH = None if backward is None else self.backward(*backward)
        stats = None if forward is None else self.forward(*forward)
        return dH, stats

    def _maybe_rehash(self, serial):
        if not self.net.uses_tables:
            return
        rehash, rebuild = self.schedule.step(serial)
        if rebuild or rehash:
            if not self.net.weights_finite():
                raise FloatingPointError(f"shard {self.q}: non-finite weights at batch {serial}")
            if rebuild:
                self.net.rebuild(serial)
            else:
                self.net.rehash(serial)

    def memory_bytes(self):
        """Bytes of the arrays this shard owns: weights, optimizer state, LSH tables (and their
        cached codes), label distribution, per-batch scratch."""
        net = self.net
        arrays = [net.W, net.B, net.out_stamp] + list(self.opt.state_arrays().values())
        for name in ("sc", "store", "out_rows"):
            arrays += [a for a in getattr(net, name, ()) if isinstance(a, np.ndarray)]
        if net.negatives.q is not None:
            arrays += [net.negatives.q, net.negatives.cdf, net.negatives.cdf_lo]
        arrays += [net.negatives.corr, net.negatives.corr_mix]
        arrays += list(getattr(self, "_scratch", ()))
        for buf in getattr(self, "_free", []):
            arrays += list(buf)
        n = sum(int(a.nbytes) for a in arrays)
        for idx in net.indices.values():
            n += idx.memory_bytes()
            codes = getattr(idx, "codes", None)
            n += int(codes.nbytes) if codes is not None else 0
        return n

    def mean_active(self):
        """The mean active outputs a sample of the latest forward pass."""
        return getattr(self, "_active", 0.0)

    def sync(self):
        """Apply the optimizer's pending zero-gradient steps (``SlideClassifier.sync``)."""
        self.opt.flush(self.net.W, self.net.B)
        return True

    # -- inference -----------------------------------------------------------------------------
    def topk_exact(self, H, k, chunk=32768):
        """(scores, global label ids), each [n, min(k, n_local)], best first."""
        W, b = self.net.output_view()
        with threadpool_limits(1, user_api="blas"):    # a product per Numba thread
            best_s, best_i = topk_of_logits(np.asarray(H, np.float32), W, b, int(k), chunk)
        return best_s, best_i + self.lo

    def topk_lse(self, H, k, chunk=32768):
        """For the neighbour vote's blend (``slide.rank.vote``): this shard's top-k logits
        (float64, best first) and their global ids, and each row's running log-sum-exp over the
        shard's labels as (max, sum of exp(z - max)), which the driver combines across
        shards."""
        W, b = self.net.output_view()
        with threadpool_limits(1, user_api="blas"):    # a product per Numba thread
            top_z, top_ids, run_max, run_sum = topk_lse_of_logits(np.asarray(H, np.float32), W,
                                                                  b, int(k), chunk)
        return top_z, np.where(top_ids >= 0, top_ids + self.lo, -1), run_max, run_sum

    def logits_at(self, H, rows, labels):
        """Logits (float64) of the (row of H, global label) pairs, all in this shard's range."""
        W, b = self.net.output_view()
        j = np.asarray(labels, np.int64) - self.lo
        H = np.asarray(H, np.float32)
        return (np.einsum("ij,ij->i", H[rows], W[j]) + b[j]).astype(np.float64)

    def prior_scores(self, n):
        """The ``n`` highest biases of the shard: (biases, global ids)."""
        _, b = self.net.output_view()
        n = min(int(n), self.n_local)
        ids = np.argpartition(-b, n - 1)[:n] if 0 < n < self.n_local else np.arange(n)
        return b[ids].copy(), ids.astype(np.int64) + self.lo

    def topk_sparse(self, H, k, prior_global, n_candidates=None):
        """Sparse serving top-k through this shard's serving index (``slide.kernels.lsh.serving``,
        built from the shard's weights on first use, whatever sampler trained it): each row's
        most-colliding labels plus the listed prior ids of this shard, scored exactly.
        (scores, global ids), -inf / -1 where fewer than k labels were scored."""
        net = self.net
        Wo, bo = net.output_view()
        prior = np.asarray(prior_global, np.int64) - self.lo
        ids, scores = net.serving_index().topk(np.ascontiguousarray(H, np.float32), Wo, bo,
                                               min(int(k), self.n_local), prior, n_candidates)
        return scores, np.where(ids >= 0, ids + self.lo, -1)

    def scores(self, H):
        W, b = self.net.output_view()
        return np.asarray(H, np.float32) @ W.T + b

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self):
        """{"meta": JSON-able, "arrays": name -> array}: weights, LSH tables, optimizer state,
        schedule, label distribution (``OutputShard.from_state`` continues exactly)."""
        ns = self.net.state_dict()
        os_ = self.opt.state_dict()
        meta = {"q": self.q, "lo": self.lo, "hi": self.hi, "n_hidden": self.n_hidden,
                "n_labels": self.n_labels, "config": self.config, "network": ns["meta"],
                "optimizer": os_["meta"], "schedule": self.schedule.state(),
                "hashed_at": {str(k): int(v) for k, v in self.net._hashed_at.items()}}
        arrays = {f"net_{k}": v for k, v in ns["arrays"].items()}
        arrays.update({f"opt_{k}": v for k, v in os_["arrays"].items()})
        arrays["out_stamp"] = self.net.out_stamp.copy()
        return {"meta": meta, "arrays": arrays}

    def save_part(self, path):
        """Write this shard's state to ``path`` atomically; returns the file's name."""
        return write_part(path, self.state_dict())

    @classmethod
    def from_file(cls, path):
        """The shard saved by :meth:`save_part` (CheckpointError naming the file)."""
        state = read_part(path)
        try:
            return cls.from_state(state)
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(path, f"invalid shard state ({type(exc).__name__}: "
                                        f"{exc})") from None

    @classmethod
    def from_state(cls, state):
        """The shard of :meth:`state_dict`; ValueError naming what does not fit."""
        meta, arrays = state["meta"], state["arrays"]
        sh = cls(meta["q"], meta["lo"], meta["hi"], meta["n_hidden"], meta["n_labels"],
                 meta["config"], init=False)
        net_arrays = {k[4:]: v for k, v in arrays.items() if k.startswith("net_")}
        net = Network.from_state({"meta": meta["network"], "arrays": net_arrays})
        if tuple(net.layout.sizes) != tuple(sh.net.layout.sizes):
            raise ValueError(f"shard {meta['q']}: network sizes {net.layout.sizes} do not fit")
        net._hashed_at = {int(k): int(v) for k, v in meta.get("hashed_at", {}).items()}
        stamp = np.asarray(arrays["out_stamp"])
        if stamp.shape != net.out_stamp.shape:
            raise ValueError(f"shard {meta['q']}: out_stamp does not fit")
        net.out_stamp[:] = stamp
        sh.net = net
        opt_arrays = {k[4:]: v for k, v in arrays.items() if k.startswith("opt_")}
        sh.opt = SparseOptimizer.from_state(net.layout, {"meta": meta["optimizer"],
                                                         "arrays": opt_arrays})
        sh.schedule.set_state(meta["schedule"])
        return sh
