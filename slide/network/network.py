"""``Network``: owns a network's arrays (parameters, gradient buffers, LSH indices, per-fit
scratch) and calls the engine's kernels: ``slide.kernels.sample`` (one sample),
``slide.kernels.touched``, ``slide.kernels.negatives``, and this package's ``batch`` /
``block`` (one batch), ``dense`` and ``infer``. It holds no post-fit stage: the vote and the
re-ranker read it through ``output_layer()`` (``slide.rank``)."""
import math

import numpy as np

from slide.kernels.arrays import (CFG_BUDGET, CFG_SAMPLER, SAMPLER_RANDOM, Params, Spec, i64,
                                  make_touched, pack_tables)
from slide.kernels.layers import Layout, init_params
from slide.kernels.losses import LOSS_SIGMOID, LOSS_SOFTMAX, LOSS_SOFTMAX_EACH, loss_marker
from slide.kernels.lsh.hashes import FAMILIES, bits_per_hash
from slide.kernels.lsh.index import LSHIndex
from slide.kernels.lsh.samplers import SAMPLERS
from slide.kernels.lsh.serving import ServingIndex
from slide.kernels.negatives import SharedNegatives
from slide.kernels.output import OutputLayer
from slide.kernels.rng import STREAM_LAYER_SEED, derived_seed
from slide.network import batch as _batch, block_step as _block_step, infer as _infer
from slide.network.dense import train_batch_dense
from slide.network.state import network_from_state
from slide.network.worker import Worker


LOSSES = {"softmax": LOSS_SOFTMAX, "sigmoid": LOSS_SIGMOID, "softmax_each": LOSS_SOFTMAX_EACH}
STATE_FORMAT = 1
_SCRATCH_ATTRS = ("GW", "GB", "sc", "store", "out_rows", "losses", "block", "_scratch_key")
ENGINES = ("batched", "per_sample")


class Network:
    """Parameters, gradient buffers, LSH indices and per-fit scratch of one network.

    ``sizes = (n_features, h1, ..., n_labels)``; ``sparse[l]`` says whether layer l selects
    active neurons instead of computing all of them; ``min_active[l]`` pads a sparse layer's
    active set with random neurons. ``lsh`` (for sparse layers): dict(sampler, family, K, L,
    range_pow, bucket_size, policy, budget, threshold); sampler "random" needs no tables.
    """

    def __init__(self, sizes, sparse, min_active, loss="softmax", seed=0, lsh=None, init=True,
                 shared_negatives=0, correct=True, negative_power=0.0, engine="batched",
                 shared_head=0):
        self.layout = lay = Layout(tuple(int(s) for s in sizes))
        L = lay.n_layers
        self.sparse = np.asarray(sparse, dtype=np.bool_).reshape(L)
        self.min_active = i64(min_active).reshape(L)
        self.loss = loss
        self.loss_code = LOSSES[loss]
        self.loss_marker = loss_marker(self.loss_code)
        self.seed = int(seed)
        if init:
            self.W, self.B = init_params(lay, self.seed)
        else:
            self.W = np.zeros(lay.n_weights, np.float32)
            self.B = np.zeros(lay.n_biases, np.float32)
        # a sampled output layer takes the per-row path (slide.network.row_steps.batch_row_steps):
        # its gradient never lives in a buffer, so the buffers stop where the output layer starts
        self.row_path = bool(self.sparse[-1]) and L > 1
        self.GW = np.zeros(int(lay.w_off[-2]) if self.row_path else lay.n_weights, np.float32)
        self.GB = np.zeros(int(lay.b_off[-2]) if self.row_path else lay.n_biases, np.float32)
        self.correct = bool(correct)
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        # "batched": a sampled output layer's shared negatives go through BLAS for the whole
        # batch (slide.network.block); "per_sample": every sample scores them in its own loops
        # (slide.network.batch, the reference the batched engine is tested against)
        self.engine = engine
        self.block_shared = None     # the batched engine's block of the latest batch
        self.pending_batch = None    # a batch block_step.forward_backward left for update
        self.negatives = SharedNegatives(int(shared_negatives) if self.sparse[-1] else 0,
                                         negative_power, int(lay.n_out[-1]), int(shared_head))
        self.n_in, self.n_out = lay.n_in, lay.n_out
        self.w_off, self.b_off, self.row_off = lay.w_off, lay.b_off, lay.row_off
        self.touched_rows = make_touched(lay)
        self.lsh = dict(lsh or {"sampler": "random"})
        self.lsh.setdefault("sampler", "random")
        self.indices = {}            # layer -> LSHIndex
        self._hashed_at = {}         # layer -> serial of the batch its codes were taken after
        self.last_dirty = 0
        # per output neuron: serial of the batch that last updated it (incremental rehash)
        self.out_stamp = np.zeros(int(lay.n_out[-1]) if self.row_path else 1, np.int64)
        self._scratch_key = None
        self.feature_rows = None
        # the other workers of a run with several batches in flight (``slide.network.worker``;
        # the network is the first): their output stamps count for the incremental rehash
        self.workers = []
        # slide.kernels.lsh.serving.ServingIndex over the output layer: built on demand by sparse
        # inference, dropped whenever training changes the weights (slide.network.trainer.train)
        self.serving = None
        self.spec = Spec(L, self.n_in, self.n_out, self.w_off, self.b_off, self.sparse,
                         self.min_active, self.loss_code, self._lsh_cfg())
        self._pack_lsh()

    def _lsh_cfg(self):
        cfg = np.zeros(7, np.int64)
        cfg[CFG_SAMPLER] = SAMPLER_RANDOM
        if self.uses_tables:
            c = self.lsh
            cfg[:] = [SAMPLERS[c["sampler"]], FAMILIES[c["family"]], c["K"], c["L"],
                      bits_per_hash(c["family"], c["K"], c["range_pow"]), c["budget"],
                      c["threshold"]]
        elif self.sparse.any():
            cfg[CFG_BUDGET] = 0
        return cfg

    @property
    def cfg(self):
        return self.spec.cfg

    @property
    def params(self):
        return Params(self.W, self.B, self.GW, self.GB)

    @property
    def n_shared(self):
        return self.negatives.n_shared

    @property
    def uses_tables(self):
        return bool(self.sparse.any()) and self.lsh["sampler"] != "random"

    def weights_finite(self):
        return bool(np.isfinite(self.W).all() and np.isfinite(self.B).all())

    def output_view(self):
        L = self.layout.n_layers
        return self.layout.weight_view(self.W, L - 1), self.layout.bias_view(self.B, L - 1)

    def output_layer(self):
        """The output layer as the ranking stages read it (``slide.kernels.output``): views
        of the weights, not copies."""
        Wo, bo = self.output_view()
        return OutputLayer(Wo, bo, self.loss == "sigmoid")

    # -- LSH ---------------------------------------------------------------------------------
    def weight_rows(self, l):
        """Layer l's neurons as rows [n_out, n_in] (the vectors the tables hash)."""
        Wl = self.layout.weight_view(self.W, l)
        return np.ascontiguousarray(Wl.T) if l == 0 else Wl

    def layer_seed(self, l):
        return derived_seed(self.seed, STREAM_LAYER_SEED, l)

    def _incremental(self, l):
        """Whether layer l's rehash may re-hash only the rows updated since the previous one:
        the sampled output layer, whose updates are stamped in ``out_stamp``."""
        return self.row_path and l == self.layout.n_layers - 1

    def build_indices(self):
        """Hash every sparse layer's neurons into fresh tables."""
        if not self.uses_tables:
            return
        c = self.lsh
        for l in range(self.layout.n_layers):
            if self.sparse[l]:
                idx = LSHIndex(c["family"], int(self.n_in[l]), c["K"], c["L"], c["range_pow"],
                               bucket_size=c["bucket_size"], policy=c["policy"],
                               seed=self.layer_seed(l))
                self.indices[l] = idx.build(self.weight_rows(l))
                self._hashed_at[l] = 0
        self._pack_lsh()

    def rehash(self, serial=0):
        """Reinsert every neuron of every sparse layer (same hash functions); the output layer
        re-hashes only the rows updated since the previous (re)hash (``LSHIndex.refresh``)."""
        for l, idx in self.indices.items():
            dirty = None
            if self._incremental(l) and idx.codes is not None:
                stamp = self.out_stamp
                for w in self.workers:
                    stamp = np.maximum(stamp, w.out_stamp)
                dirty = np.flatnonzero(stamp > self._hashed_at.get(l, 0))
                self.last_dirty = int(dirty.size)
            idx.refresh(self.weight_rows(l), dirty)
            if self._incremental(l):
                self._hashed_at[l] = int(serial)
        self._pack_lsh()

    def rebuild(self, serial=0):
        """New hash functions for every sparse layer (``LSHIndex.rebuild``'s seed rule), then
        reinsert every neuron."""
        for l, idx in self.indices.items():
            idx.rebuild(self.weight_rows(l), check_finite=False)
            if self._incremental(l):
                self._hashed_at[l] = int(serial)
        self._pack_lsh()

    def set_indices(self, indices):
        """Install restored LSH indices ({layer: LSHIndex}, e.g. from a checkpoint) and repack
        the kernels' view of them."""
        self.indices = dict(indices)
        self._pack_lsh()

    def _pack_lsh(self):
        """The kernels' view of the LSH arrays (call after the indices changed); None for a
        network without tables, whose kernels then compile without the LSH code
        (``sample.select_active``)."""
        self.tables = pack_tables(self.layout.n_layers, self.indices) if self.uses_tables \
            else None

    # -- scratch -----------------------------------------------------------------------------
    def prepare(self, batch_size, n_chunks, max_labels):
        """Allocate the per-fit scratch (once; reused while shapes allow)."""
        key = (int(batch_size), int(n_chunks), int(max_labels))
        if self._scratch_key == key:
            return
        # the network is its own first worker (slide.network.worker): its scratch, with the
        # network's output stamps, touched-row lists and gradient buffers
        own = Worker.allocate(self, batch_size, n_chunks, max_labels, out_stamp=self.out_stamp,
                              touched_rows=self.touched_rows, gradients=(self.GW, self.GB))
        self.sc, self.store, self.block = own.sc, own.store, own.block
        self.losses, self.out_rows, self.feature_rows = own.losses, own.out_rows, None
        self._scratch_key = key

    def release_scratch(self):
        """Drop the per-fit scratch (``prepare`` allocates it again for the next training):
        nothing after training reads it, and the end of ``fit`` (the neighbour memory, the
        re-ranker) is where a large model's memory peaks."""
        for name in ("sc", "store", "out_rows", "losses", "block", "feature_rows"):
            if hasattr(self, name):
                setattr(self, name, None)
        self._scratch_key = None

    # -- training ----------------------------------------------------------------------------
    def set_label_counts(self, counts):
        """Training-label counts (length n_labels) for frequency-proportional negatives."""
        self.negatives.set_label_counts(counts)

    @property
    def batched(self):
        """Whether batches take the batched engine (a sampled output layer after hidden
        layers, ``engine="batched"``)."""
        return self.row_path and self.engine == "batched"

    @property
    def fused_first(self):
        """Whether the first layer's rows get their gradient and update fused from the
        per-sample deltas (the batched engine, a dense first layer), not through GW."""
        return self.batched and not self.sparse[0]

    def forward_backward(self, X, Y, rows, seed, serial):
        """Steps 1-6 of a batch, nothing applied (tests, diagnostics): per-sample losses."""
        if self.batched:
            return _block_step.forward_backward(self, X, Y, rows, seed, serial)
        return _batch.forward_backward(self, X, Y, rows, seed, serial)

    def touched(self, X, rows, serial):
        """List the touched rows of batch ``rows`` into ``touched_rows``: (n_rows, n_bias)."""
        return _batch.touched(self, X, rows, serial)

    def update(self, X, rows, serial, optimizer):
        """Step 7 of the batch ``forward_backward`` computed: the optimizer's step."""
        if self.batched:
            _block_step.update(self, optimizer)
        else:
            _batch.update(self, X, rows, serial, optimizer)

    def train_batch(self, X, Y, rows, seed, serial, optimizer):
        """One batch: kernel, touched rows, optimizer step. Returns (mean loss, mean active
        output neurons). A diverged batch (non-finite loss) is reported, never applied."""
        if self.batched:
            # the whole batch in one compiled call, applied when every loss is finite
            loss, active = _block_step.train_batch(self, X, Y, rows, seed, serial, optimizer)
        else:
            losses = self.forward_backward(X, Y, rows, seed, serial)
            loss = float(losses.mean())
            if math.isfinite(loss):
                self.update(X, rows, serial, optimizer)
            active = float(self.sc.n_act[:rows.shape[0], -1].mean())
        if not math.isfinite(loss):
            self.clear_gradients()
        return loss, active

    def clear_gradients(self):
        """Zero every worker's gradient buffers after a diverged batch: its finite samples
        left their gradient there (the optimizer step zeroes them, and it did not run), and a
        fit resumed after the DivergenceError would add it to its next step. Rare, so all of
        them."""
        for w in [self] + list(self.workers):
            w.GW[:] = 0.0
            w.GB[:] = 0.0

    def train_batch_dense(self, X, Y, rows, serial, optimizer):
        """The dense (full softmax) network's batch (``slide.network.dense``)."""
        return train_batch_dense(self, X, Y, rows, serial, optimizer)

    def sample_loss_and_grads(self, x_indices, x_data, labels, serial=1, return_active=False):
        """Loss and gradients (flat GW, GB) of ONE sample, without updating anything (its
        active sets are those of batch ``serial``, position 0). For tests: compare with a
        dense reference / finite differences. With ``return_active`` also a list with each
        layer's active neuron ids (None for a dense layer)."""
        old = {a: getattr(self, a, None) for a in _SCRATCH_ATTRS}
        self.GW = np.zeros_like(self.GW)
        self.GB = np.zeros_like(self.GB)
        self._scratch_key = None
        try:
            return _batch.one_sample(self, x_indices, x_data, labels, serial, return_active)
        finally:
            for a, v in old.items():
                setattr(self, a, v)

    # -- inference ---------------------------------------------------------------------------
    def hidden(self, X, lo=0, hi=None, n_chunks=None):
        """Last hidden layer (every neuron active) of rows lo..hi-1: float32 [n, h_last]."""
        return _infer.hidden(self, X, lo, hi, n_chunks)

    def predict_topk_exact(self, X, k, block=1024, chunk=32768, with_scores=False):
        return _infer.topk_exact(self, X, k, block, chunk, with_scores)

    def prior_ids(self, n):
        return _infer.prior_ids(self, n)

    def predict_topk_sparse(self, X, k, call=0, prior_candidates=0):
        return _infer.topk_sparse(self, X, k, call, prior_candidates)

    def serving_index(self, **overrides):
        """The output layer's serving index (``slide.kernels.lsh.serving``): the cached one when
        it fits the weights' shape and every given override, else a new one built from the
        weights."""
        Wo, bo = self.output_view()
        ix = self.serving
        given = {k: v for k, v in overrides.items() if v is not None}
        n_cand = given.pop("n_candidates", None)     # a query setting: no rebuild for it
        if ix is None or not ix.fits(Wo) or any(getattr(ix, k) != v for k, v in given.items()):
            self.serving = ix = ServingIndex.build(Wo, bo, seed=self.seed, **given)
        if n_cand is not None:
            ix.set_candidates(n_cand)
        return ix

    def predict_topk_serving(self, X, k, prior_candidates=0, n_candidates=None):
        return _infer.topk_serving(self, X, k, prior_candidates, n_candidates)

    def predict_scores(self, X, block=1024):
        return _infer.scores(self, X, block)

    def predict_proba(self, X, block=1024):
        return _infer.proba(self, X, block)

    # -- state -------------------------------------------------------------------------------
    def state_dict(self):
        """{"meta": JSON-able settings, "arrays": name -> array (copies)}: the weights, the
        label distribution of the shared negatives, and each LSH index (arrays ``lsh{l}_*``).
        ``Network.from_state`` rebuilds a network that trains and predicts identically."""
        meta = {"format": STATE_FORMAT, "sizes": [int(s) for s in self.layout.sizes],
                "sparse": [bool(s) for s in self.sparse],
                "min_active": [int(m) for m in self.min_active], "loss": self.loss,
                "seed": self.seed, "lsh": self.lsh, "shared_negatives": self.n_shared,
                "correct": self.correct, "negative_power": self.negatives.power,
                "shared_head": self.negatives.n_head, "indices": {}}
        arrays = {"W": self.W.copy(), "B": self.B.copy()}
        if self.negatives.q is not None:
            arrays["neg_q"] = self.negatives.q.copy()
        for l, idx in self.indices.items():
            d = idx.state_dict()
            meta["indices"][str(l)] = {k: v for k, v in d.items() if not isinstance(v, np.ndarray)}
            arrays.update({f"lsh{l}_{k}": v for k, v in d.items() if isinstance(v, np.ndarray)})
        return {"meta": meta, "arrays": arrays}

    @classmethod
    def from_state(cls, state):
        """The network of :meth:`state_dict`'s output; ValueError naming what does not fit."""
        return network_from_state(cls, state)
