"""``SparseOptimizer``: the state of Adam or SGD over a network's flat parameters (moments,
step records, the rate of every step) and its steps over the rows a batch touched. The
arithmetic and its semantics (dense Adam's trajectory at sparse cost) are documented in
``slide.network.adam``; the fused row steps are in ``slide.network.row_steps``.
"""
import numba
import numpy as np

from slide.kernels.arrays import Store, make_feature_rows, make_output_rows
from slide.kernels.layers import zeros_touched

from typing import NamedTuple

from slide.kernels.jit import njit
from slide.network.adam import (KIND_ADAM, KIND_SGD, OPTIMIZERS, RATE_BLOCK, Hyper, Moments,
                                TouchedStep, adam_flush_rows, adam_ids, adam_ids_serial, adam_lr,
                                block_powers, discounted_rate_sum, extend_rate_sums,
                                power_tables, touched_step)
from slide.network.row_steps import batch_row_steps, first_layer_step


class RowChunks(NamedTuple):
    """How a fused row step deals its rows to threads (``rows_a_chunk``)."""
    most: int                # at most this many rows a chunk
    per_thread: int          # fewer where a thread would get fewer chunks than this
    least: int               # at least this many


# the batched engine's fused row steps (``row_chunk``). On 2 threads, the same batches in one
# process: chunks of 64-256 rows the same, 8-32 slower (per-chunk scheduling, and the next
# row's prefetch stops at a chunk's end)
ROW_CHUNKS = RowChunks(most=256, per_thread=8, least=16)
# biases a step updates on the calling thread (``adam_ids_serial``) rather than in a parallel
# loop, beyond 2 threads: the batched engine's first layer has a bias step of its own every
# batch (one bias a hidden unit), and at 16 threads a loop's fork and join alone cost 80-93 us
# on TBB, the work of a thousand biases (bench/results/device_phases_3ded589/README.md)
SERIAL_IDS = 512


# ``step_batch_rows``'s parts when there are no such rows, typed as the batched engine's
_NO_FIRST_ROWS = (make_feature_rows(0, 1, 1, 1), 0, np.zeros(0, np.float32),
                  np.zeros((0, 1), np.float32))
_NO_EXTRA_ROWS = (make_output_rows(np.zeros(1, np.int64), 1, 1, 1, 1, 1), 0,
                  Store(np.zeros((1, 1), np.float32), np.zeros((1, 1), np.float32)))
_NO_BLOCK_ROWS = (np.zeros(0, np.int32), np.zeros((0, 1), np.float32), np.zeros(0, np.float32),
                  np.zeros(0, np.int64), 0)


def row_chunk(n_rows):
    """Rows a thread takes at a time from a fused row step over ``n_rows`` rows."""
    return rows_a_chunk(int(n_rows), ROW_CHUNKS, numba.get_num_threads())


@njit(cache=True, nogil=True)
def rows_a_chunk(n_rows, sizes, n_threads):
    """Rows a thread takes at a time from a fused row step over ``n_rows`` rows on
    ``n_threads`` threads, dealt as ``sizes`` (``RowChunks``) says."""
    per = n_rows // (sizes.per_thread * n_threads)
    return max(sizes.least, min(sizes.most, per))


class BatchStep(NamedTuple):
    """The optimizer's part of one compiled batch (``SparseOptimizer.compiled_step_args``)."""
    touched: TouchedStep     # the hidden layers' touched rows and biases
    out_moments: Moments     # the moments with the output layer's step records
    first_records: np.ndarray  # the first layer's row step records (empty: no catch-up)


# re-exported: the optimizer's public names live here
__all__ = ["SparseOptimizer", "OPTIMIZERS", "RATE_BLOCK", "adam_lr", "block_powers",
           "discounted_rate_sum", "extend_rate_sums"]


class SparseOptimizer:
    """Owns the optimizer state (moments, step records, step count, the rate of every step)
    of a network's flat parameters (``layout``: ``slide.kernels.layers.Layout``).

    ``step(...)`` applies one update to the touched rows and biases listed by the engine at
    the current ``learning_rate`` (the trainer sets it before each batch); ``flush()`` brings
    every row up to date (``"adam"`` only; a no-op otherwise) and must run before the weights
    are used for inference. ``step_rates`` records every step's rate (Adam: bias-corrected),
    which the catch-up reads: it is state, saved with the moments.
    """

    def __init__(self, kind, layout, learning_rate, beta1=0.9, beta2=0.999, epsilon=1e-8):
        if kind not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)}, got {kind!r}")
        self.kind = kind
        self.layout = layout
        self.learning_rate = float(learning_rate)
        self.beta1 = float(beta1)
        self.beta2 = float(beta2)
        self.epsilon = float(epsilon)
        n_weights, n_biases = layout.n_weights, layout.n_biases
        if kind in ("adam", "lazy_adam"):
            self.MW = zeros_touched(n_weights, np.float32)
            self.VW = zeros_touched(n_weights, np.float32)
            self.MB = np.zeros(n_biases, dtype=np.float32)
            self.VB = np.zeros(n_biases, dtype=np.float32)
        else:
            self.MW = self.VW = np.zeros(0, dtype=np.float32)
            self.MB = self.VB = np.zeros(0, dtype=np.float32)
        # step of each row's / bias's last update (0: never); empty: no catch-up
        if kind == "adam":
            self.TW = np.zeros(int(layout.row_off[-1]), dtype=np.int32)
            self.TB = np.zeros(n_biases, dtype=np.int32)
        else:
            self.TW = np.zeros(0, dtype=np.int32)
            self.TB = np.zeros(0, dtype=np.int32)
        # the rate of every step so far (index = step, entry 0 unused; grown by doubling) and
        # its block prefix sums, which the catch-up kernels read through Hyper
        self._powers = block_powers(self.beta1, self.beta2)
        self._power_tables = power_tables(self.beta1, self.beta2)
        self._t = 0
        # False for a model loaded from a file saved without this state (``save(...,
        # optimizer_state=False)``): it predicts, but cannot continue its run (``trainer``)
        self.has_state = True
        self._compiled_static = None     # compiled_step_args' bundles of the moments
        self._rates = np.zeros(RATE_BLOCK, np.float64)
        self._rate_sums = np.zeros(RATE_BLOCK, np.float64)

    # -- the step count and the rate of each step ---------------------------------------------
    def _rate_of(self, learning_rate, t):
        """Step t's rate: Adam's bias-corrected step size, SGD's learning rate."""
        if self.kind == "sgd":
            return float(learning_rate)
        return float(adam_lr(learning_rate, self.beta1, self.beta2, t))

    def next_step(self):
        """Advance the step count by one at the current ``learning_rate`` and record the
        step's rate (O(1): one table entry and its prefix sum; the table doubles when full)."""
        t = self._t + 1
        if t >= self._rates.shape[0]:
            rates = np.zeros(2 * self._rates.shape[0], np.float64)
            sums = np.zeros_like(rates)
            rates[:t] = self._rates[:t]
            sums[:t] = self._rate_sums[:t]
            self._rates, self._rate_sums = rates, sums
        self._rates[t] = self._rate_of(self.learning_rate, t)
        extend_rate_sums(self._rates, self._rate_sums, self._powers, t, t + 1)
        self._t = t

    @property
    def t(self):
        """Steps taken so far."""
        return self._t

    @t.setter
    def t(self, value):
        """Set the step count; steps beyond those recorded count as taken at the current
        ``learning_rate`` (``set_step_rates`` gives each step's rate)."""
        value = int(value)
        if value < 0:
            raise ValueError(f"optimizer step count must be non-negative, got {value}")
        known = min(value, self._t)
        rates = np.concatenate([self._rates[:known + 1],
                                self.constant_rates(value)[known + 1:]])
        self.set_step_rates(rates)

    @property
    def step_rates(self):
        """The rate of every step so far, ``[0, c_1, ..., c_t]`` (float64, a read-only view)."""
        view = self._rates[:self._t + 1]
        view.flags.writeable = False
        return view

    def set_step_rates(self, rates):
        """Continue after ``len(rates) - 1`` steps taken at these rates (the ``step_rates`` of
        a saved optimizer); ValueError unless they are a non-empty 1-D float64 array of finite
        non-negative numbers."""
        rates = np.asarray(rates)
        if rates.ndim != 1 or rates.shape[0] < 1 or rates.dtype != np.float64:
            raise ValueError(f"optimizer step rates must be a non-empty 1-D float64 array, got "
                             f"shape {rates.shape} and dtype {rates.dtype}")
        if not (np.isfinite(rates).all() and (rates >= 0).all()):
            raise ValueError("optimizer step rates must be finite and non-negative")
        t = rates.shape[0] - 1
        cap = RATE_BLOCK
        while cap <= t:
            cap *= 2
        self._rates = np.zeros(cap, np.float64)
        self._rates[1:t + 1] = rates[1:]
        self._rate_sums = np.zeros(cap, np.float64)
        extend_rate_sums(self._rates, self._rate_sums, self._powers, 0, t + 1)
        self._t = t

    def constant_rates(self, t):
        """The rates of ``t`` steps all taken at the current ``learning_rate`` (for a state
        saved before the rates were recorded)."""
        k = np.arange(t + 1, dtype=np.float64)
        if self.kind == "sgd":
            rates = np.full(t + 1, self.learning_rate, np.float64)
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                rates = adam_lr(self.learning_rate, self.beta1, self.beta2, k)
        rates[0] = 0.0
        return rates

    @property
    def _adam(self):
        return self.kind != "sgd"

    @property
    def moments(self):
        return Moments(self.MW, self.VW, self.MB, self.VB, self.TW, self.TB)

    def _hyper(self):
        """The kernels' bundle at the current step: its recorded rate, betas, eps, the rate
        record."""
        t = self._t
        lr_t = self._rates[t] if t > 0 else self._rate_of(self.learning_rate, 1)
        return Hyper(float(lr_t), self.beta1, self.beta2, self.epsilon, int(t), self._rates,
                     self._rate_sums, self._power_tables)

    def step(self, params, touched, n_rows, n_bias):
        """One step on the rows and biases a batch touched: ``params`` (W, B, GW, GB) and
        ``touched`` (starts, lens, rowids, bias_ids) are ``slide.kernels.arrays`` bundles;
        the first ``n_rows`` / ``n_bias`` entries are used (``adam.touched_step``)."""
        self.next_step()
        touched_step(params, touched, n_rows, n_bias,
                     self._touched_args(self.moments, numba.get_num_threads()))

    def _touched_args(self, moments, n_threads):
        """``adam.touched_step``'s ``opt`` at the current step over ``n_threads``."""
        return TouchedStep(moments, self._hyper(), KIND_ADAM if self._adam else KIND_SGD,
                           SERIAL_IDS if n_threads > 2 else -1, self.learning_rate)

    def compiled_step_args(self, n_threads):
        """Advance the step count (``next_step``) and return what the compiled batch
        (``slide.network.block_step.block_batch``) takes for its optimizer steps over
        ``n_threads``: a ``BatchStep``. ``cancel_step`` undoes the advance when the batch is
        not applied. Several batches in flight claim their steps here in batch order, each
        with its own rate (``Hyper``)."""
        self.next_step()
        arrays = (self.MW, self.VW, self.MB, self.VB, self.TW, self.TB)
        static = getattr(self, "_compiled_static", None)
        # the bundles of the moments change only with the arrays (a new array cannot take a
        # cached one's id: the cache holds those alive), so they are built once, not every
        # batch
        if static is None or static[0] != tuple(id(a) for a in arrays):
            lay = self.layout
            tw = self.TW[int(lay.row_off[0]):int(lay.row_off[1])] if self.TW.shape[0] \
                else self.TW
            static = (tuple(id(a) for a in arrays), self.moments, self._output_args()[0], tw)
            self._compiled_static = static
        _, mom, mom_out, tw = static
        return BatchStep(self._touched_args(mom, n_threads), mom_out, tw)

    def cancel_step(self):
        """Take back the step ``compiled_step_args`` advanced (its batch diverged and applied
        nothing): the count is as before; the rate it recorded is written again by the next
        step."""
        self._t -= 1

    def step_output(self, W, B, out_rows, n_uniq, store):
        """The sampled output layer's fused gradient + update of its ``n_uniq`` row-path rows
        (``batch_row_steps`` with no first-layer or block rows; call after ``step`` of the
        same batch: it uses the same step count)."""
        self.step_batch_rows(W, B, _NO_FIRST_ROWS, (out_rows, n_uniq, store), _NO_BLOCK_ROWS)

    def _output_args(self):
        """(moments with the output layer's step records, hyper, kind) of the output layer's
        row updates."""
        lay = self.layout
        last = lay.n_layers - 1
        mom = self.moments
        if mom.TW.shape[0]:
            mom = mom._replace(TW=self.TW[int(lay.row_off[last]):int(lay.row_off[last + 1])],
                               TB=self.TB[int(lay.b_off[last]):int(lay.b_off[last + 1])])
        return mom, self._hyper(), KIND_ADAM if self._adam else KIND_SGD

    def step_block(self, W, B, rows, dW, db, stamp, serial):
        """The batched engine's shared block of the output layer alone (``batch_row_steps``
        with no first-layer or extras' rows; after ``step`` of the same batch)."""
        self.step_batch_rows(W, B, _NO_FIRST_ROWS, _NO_EXTRA_ROWS, (rows, dW, db, stamp, serial))

    def step_output_rows(self, W, B, extras, block):
        """The sampled output layer's rows alone, the extras' and the block's
        (``step_batch_rows`` with no first-layer rows; after ``step`` or ``next_step`` of the
        same batch): a label shard's update."""
        self.step_batch_rows(W, B, _NO_FIRST_ROWS, extras, block)

    def step_first(self, W, frows, n_uniq, x_val, dels):
        """The batched engine's fused first-layer step (``first_layer_step``; after ``step``
        of the same batch, which then had the first layer's biases but not its rows)."""
        lay = self.layout
        tw = self.TW[int(lay.row_off[0]):int(lay.row_off[1])] if self.TW.shape[0] else self.TW
        first_layer_step(W, self.MW, self.VW, tw, self._hyper(),
                         KIND_ADAM if self._adam else KIND_SGD, int(lay.w_off[0]), frows,
                         n_uniq, x_val, dels)

    def step_batch_rows(self, W, B, first, extras, block):
        """The batched engine's three row steps in one parallel loop (``batch_row_steps``;
        after ``step`` of the same batch): the first layer's, ``first`` = (frows, n_uniq,
        x_val, dels; n_uniq 0 when the layer is not fused), as ``step_first``; the extras',
        ``extras`` = (out_rows, n_uniq, store), as ``step_output``; the block's, ``block`` =
        (rows, dW, db, stamp, serial). Rows are dealt ``row_chunk`` at a
        time: the three kinds differ in cost, and an equal range a thread would not
        balance."""
        lay = self.layout
        tw = self.TW[int(lay.row_off[0]):int(lay.row_off[1])] if self.TW.shape[0] else self.TW
        mom, h, kind = self._output_args()
        last = lay.n_layers - 1
        frows, nf, x_val, dels = first
        out_rows, nu, store = extras
        rows, dW, db, stamp, serial = block
        with numba.parallel_chunksize(row_chunk(nf + nu + rows.shape[0])):
            batch_row_steps(W, B, mom, h, kind, np.int64(lay.w_off[last]),
                            np.int64(lay.b_off[last]), frows,
                            (np.int64(nf), x_val, dels, np.int64(lay.w_off[0]), tw), out_rows,
                            np.int64(nu), store, (rows, dW, db, stamp, np.int64(serial)))

    @property
    def pending(self):
        """Whether some row has not received the zero-gradient steps since its last update."""
        return bool(self.TW.shape[0]) and self.t > 0 and (
            bool((self.TW[self.TW > 0] < self.t).any()) or
            bool((self.TB[self.TB > 0] < self.t).any()))

    def warm_bias_steps(self, params, touched):
        """Compile (or load) both bias kernels ``step`` picks from, by count and threads, on
        no biases: a fit's warm-up runs at tiny sizes, where the count alone would pick."""
        if self._adam:
            h = self._hyper()
            for step in (adam_ids, adam_ids_serial):
                step(params.B, self.MB, self.VB, params.GB, self.TB, touched.bias_ids, 0, h)

    def flush(self, W, B):
        """Apply every row's missed zero-gradient steps up to the current step (after it, W
        and B are what dense Adam would hold). Deterministic; idempotent."""
        if not self.TW.shape[0] or self.t == 0:
            return
        lay = self.layout
        h = self._hyper()
        for l in range(lay.n_layers):
            r0, r1 = int(lay.row_off[l]), int(lay.row_off[l + 1])
            adam_flush_rows(W, self.MW, self.VW, self.TW[r0:r1], int(lay.w_off[l]), r1 - r0,
                            int(lay.row_len[l]), h)
        adam_flush_rows(B, self.MB, self.VB, self.TB, 0, lay.n_biases, 1, h)

    def state_arrays(self):
        return {"opt_MW": self.MW, "opt_VW": self.VW, "opt_MB": self.MB, "opt_VB": self.VB,
                "opt_TW": self.TW, "opt_TB": self.TB}

    # -- state ----------------------------------------------------------------------------------
    def state_dict(self):
        """{"meta": JSON-able settings and step count, "arrays": the moments, step records and
        step rates (copies)}. ``SparseOptimizer.from_state(layout, state)`` rebuilds an
        optimizer that continues exactly."""
        meta = {"kind": self.kind, "learning_rate": self.learning_rate, "beta1": self.beta1,
                "beta2": self.beta2, "epsilon": self.epsilon, "t": int(self.t)}
        arrays = {k: v.copy() for k, v in self.state_arrays().items()}
        arrays["opt_rates"] = self.step_rates.copy()
        return {"meta": meta, "arrays": arrays}

    @classmethod
    def from_state(cls, layout, state):
        """The optimizer of :meth:`state_dict`'s output; raises ValueError naming the first
        entry that is missing or does not fit ``layout``."""
        if not isinstance(state, dict) or "meta" not in state or "arrays" not in state:
            raise ValueError("optimizer state must be a dict with 'meta' and 'arrays'")
        meta, arrays = state["meta"], state["arrays"]
        need = ("kind", "learning_rate", "beta1", "beta2", "epsilon", "t")
        missing = [k for k in need if k not in meta]
        if missing:
            raise ValueError(f"optimizer state meta lacks {missing}")
        opt = cls(meta["kind"], layout, meta["learning_rate"], meta["beta1"], meta["beta2"],
                  meta["epsilon"])
        t = meta["t"]
        if not isinstance(t, (int, np.integer)) or isinstance(t, bool) or t < 0:
            raise ValueError(f"optimizer state: t must be a non-negative integer, got {t!r}")
        if "opt_rates" in arrays:
            rates = np.asarray(arrays["opt_rates"])
            if rates.shape != (int(t) + 1,):
                raise ValueError(f"optimizer state: 'opt_rates' has shape {rates.shape}, "
                                 f"expected ({int(t) + 1},) (one rate per step)")
            opt.set_step_rates(rates)
        else:
            # saved before the rates were recorded: the past steps as at the saved rate
            opt.set_step_rates(opt.constant_rates(int(t)))
        for name, target in opt.state_arrays().items():
            if name not in arrays:
                raise ValueError(f"optimizer state lacks array {name!r}")
            a = np.asarray(arrays[name])
            if a.shape != target.shape or a.dtype != target.dtype:
                raise ValueError(f"optimizer state: {name!r} has shape {a.shape} and dtype "
                                 f"{a.dtype}, expected {target.shape} {target.dtype}")
            target[...] = a
        return opt
