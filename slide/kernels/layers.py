"""Network parameter layout and the per-layer kernels of one sample.

Every weight of every layer lives in ONE flat float32 array ``W`` (biases in ``B``) with
per-layer offsets, so a single kernel signature serves any depth:

* layer 0 reads the sparse input and is stored transposed, ``W0T[n_features, n_out0]``: a
  nonzero input feature ``f`` reads (and its gradient writes) one contiguous row of
  ``n_out0`` floats;
* layer ``l > 0`` is stored ``W[n_out, n_in]``, one contiguous row per neuron, so an active
  neuron reads one row.

A "row" (the unit the sparse optimizer visits) is therefore an input feature in layer 0 and a
neuron everywhere else. Activations of a layer are a list of (neuron id, value) pairs: a
dense layer's ids are implicit (0..n-1); a sparse layer keeps its active ids.
"""
from dataclasses import dataclass

import numpy as np
from numba import prange

from slide.kernels.jit import njit
from slide.kernels.prefetch import prefetch_row
from slide.kernels.normal import normal_pair
from slide.kernels.rng import init_stream


# fastmath without "nnan"/"ninf": reassociation lets the row loops vectorise, while NaN/Inf
# stay observable so a diverging run is detected (np.isfinite would be folded away otherwise)
FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}


@dataclass(frozen=True)
class Layout:
    """Shapes and flat offsets of a fully connected network.

    ``sizes = (n_features, h1, ..., n_labels)``; layer ``l`` maps ``sizes[l] -> sizes[l+1]``.
    """

    sizes: tuple

    def __post_init__(self):
        # the flat offsets, computed once: the training loop reads them several times a
        # batch, and a cumsum each time was a measurable share of a batch; the properties
        # hand out copies, so no caller can change them
        n_rows = self.n_rows if len(self.sizes) > 1 else self.n_out
        for name, per_layer in (("_w_off", self.n_in * self.n_out), ("_b_off", self.n_out),
                                ("_row_off", n_rows)):
            object.__setattr__(self, name, np.concatenate(
                [[0], np.cumsum(per_layer)]).astype(np.int64))

    @property
    def n_layers(self):
        return len(self.sizes) - 1

    @property
    def n_in(self):
        return np.asarray(self.sizes[:-1], dtype=np.int64)

    @property
    def n_out(self):
        return np.asarray(self.sizes[1:], dtype=np.int64)

    @property
    def n_rows(self):
        """Rows per layer (layer 0: input features; others: neurons)."""
        r = self.n_out.copy()
        r[0] = self.sizes[0]
        return r

    @property
    def row_len(self):
        """Floats per row (layer 0: its outputs; others: their inputs)."""
        r = self.n_in.copy()
        r[0] = self.sizes[1]
        return r

    @property
    def w_off(self):
        return self._w_off.copy()

    @property
    def b_off(self):
        return self._b_off.copy()

    @property
    def row_off(self):
        """Offset of each layer's rows in a flat per-row array (touched-row stamps)."""
        return self._row_off.copy()

    @property
    def n_weights(self):
        return int(self.w_off[-1])

    @property
    def n_biases(self):
        return int(self.b_off[-1])

    def weight_view(self, W, layer):
        """2-D view of one layer's block of the flat array (layer 0: ``[n_features, n_out]``)."""
        o = self.w_off
        return W[o[layer]:o[layer + 1]].reshape(int(self.n_rows[layer]), int(self.row_len[layer]))

    def bias_view(self, B, layer):
        o = self.b_off
        return B[o[layer]:o[layer + 1]]

    def memory_bytes(self, n_param_copies=4):
        """Bytes for weights + biases, times the number of same-shaped copies (W, m, v, g)."""
        return 4 * n_param_copies * (self.n_weights + self.n_biases)


# pairs of weights a task of the init's parallel loop draws (its inner loop vectorises)
INIT_CHUNK = 4096


@njit(cache=True, nogil=True, error_model="numpy")
def _normal_pairs(W, i0, n_pairs, std, seed, stream):
    """W[i0:i0 + 2 n_pairs] = the Box-Muller pairs of those positions. The stores go through a
    view indexed from 0 by the loop counter: Numba then knows the index is not negative and
    emits no wraparound test, which (with ``W[i0 + 2 p]``) kept the loop scalar."""
    V = W[i0:i0 + 2 * n_pairs]
    for p in range(n_pairs):
        a, b = normal_pair(seed, stream, i0 + 2 * p, std)
        V[2 * p] = a
        V[2 * p + 1] = b


@njit(cache=True, nogil=True, parallel=True, error_model="numpy")
def _init_normal(W, start, stop, std, seed, stream):
    """W[start:stop] = Gaussian draws of std ``std`` (``normal.normal_pair``: Box-Muller pairs
    from ``start``), in parallel over chunks of pairs: a pair depends only on its position,
    so the weights are the same on any thread count."""
    n_pairs = (stop - start) // 2
    for c in prange((n_pairs + INIT_CHUNK - 1) // INIT_CHUNK):
        lo = c * INIT_CHUNK
        _normal_pairs(W, start + 2 * lo, min(n_pairs - lo, INIT_CHUNK), std, seed, stream)
    if (stop - start) % 2:
        W[stop - 1] = normal_pair(seed, stream, stop - 1, std)[0]


@njit(cache=True, nogil=True, parallel=True)
def _fill_zero(a):
    step = 1 << 16
    n = a.shape[0]
    for c in prange((n + step - 1) // step):
        a[c * step:min(n, (c + 1) * step)] = 0


def zeros_touched(n, dtype):
    """``np.zeros(n, dtype)`` with every page written now, by every thread. np.zeros leaves
    the pages to be faulted in by their first use; for Adam's moments that is the scattered
    rows of the first few hundred batches, a page fault each, spread over the epoch's batches
    (on a VM whose host backs memory on first touch, about a second a GB). Touched here they
    cost the same but belong to building the model, where a framework's ``zeros_like``
    moments pay them too."""
    a = np.empty(int(n), dtype)
    if a.shape[0]:
        _fill_zero(a)
    return a


def init_params(layout, seed):
    """Glorot-normal weights (std = sqrt(2 / (fan_in + fan_out))) and zero biases.

    Layer 0's fan-in is counted as the number of input features, as in the dense TF baseline,
    which keeps the first layer's pre-activations small for tf-idf-like inputs.
    """
    W = np.empty(layout.n_weights, dtype=np.float32)
    B = np.zeros(layout.n_biases, dtype=np.float32)
    wo = layout.w_off
    for l in range(layout.n_layers):
        std = np.sqrt(2.0 / (layout.sizes[l] + layout.sizes[l + 1]))
        # the stream id int64, as every other caller of rng.stream_seed gives it (one compile)
        _init_normal(W, int(wo[l]), int(wo[l + 1]), std, np.uint64(seed), np.int64(init_stream(l)))
    return W, B


# rows ahead a row loop prefetches (slide.kernels.prefetch)
PREFETCH_AHEAD = 2


# ----------------------------------------------------------------------------------------------
# One-sample layer kernels (inlined into the batch kernels of slide.network)
# ----------------------------------------------------------------------------------------------

# Row loops index a slice of the flat array (``row = W[base:base + n]``), not ``W[base + i]``:
# LLVM vectorises the former, not the latter (which gets a wraparound test per index).

@njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def first_forward_dense(W, B, w_off, b_off, n_out, x_idx, x_val, out):
    """out[:n_out] = relu(b0 + sum_j x_val[j] * W0T[x_idx[j]]): one contiguous row per nonzero."""
    o = out[:n_out]
    b = B[b_off:b_off + n_out]
    for i in range(n_out):
        o[i] = b[i]
    n_x = x_idx.shape[0]
    for j in range(n_x):
        if j + PREFETCH_AHEAD < n_x:
            # the rows are scattered over W: ask for a later one while this one is summed
            prefetch_row(W, w_off + np.int64(x_idx[j + PREFETCH_AHEAD]) * n_out, n_out)
        base = w_off + np.int64(x_idx[j]) * n_out
        row = W[base:base + n_out]
        xv = x_val[j]
        for i in range(n_out):
            o[i] += xv * row[i]
    for i in range(n_out):
        if o[i] < 0.0:
            o[i] = 0.0


@njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def first_forward_sparse(W, B, w_off, b_off, n_out, x_idx, x_val, ids, n_act, out):
    """Like first_forward_dense but for the active neurons ``ids[:n_act]`` only (strided reads)."""
    for k in range(n_act):
        out[k] = B[b_off + ids[k]]
    for j in range(x_idx.shape[0]):
        base = w_off + np.int64(x_idx[j]) * n_out
        row = W[base:base + n_out]
        xv = x_val[j]
        for k in range(n_act):
            out[k] += xv * row[ids[k]]
    for k in range(n_act):
        if out[k] < 0.0:
            out[k] = 0.0


@njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def first_bias_backward(gB, b_off, n_out, dense, ids, n_act, delta):
    """gb0 += delta (racy adds: HOGWILD): the first layer's bias gradient."""
    if dense:
        d = delta[:n_out]
        gb = gB[b_off:b_off + n_out]
        for i in range(n_out):
            gb[i] += d[i]
    else:
        for k in range(n_act):
            gB[b_off + ids[k]] += delta[k]


@njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def first_backward(gW, gB, w_off, b_off, n_out, x_idx, x_val, dense, ids, n_act, delta):
    """g0T[x_idx] += outer(x_val, delta); gb0 += delta (racy adds: HOGWILD)."""
    first_bias_backward(gB, b_off, n_out, dense, ids, n_act, delta)
    if dense:
        d = delta[:n_out]
        for j in range(x_idx.shape[0]):
            base = w_off + np.int64(x_idx[j]) * n_out
            grow = gW[base:base + n_out]
            xv = x_val[j]
            for i in range(n_out):
                grow[i] += xv * d[i]
    else:
        for j in range(x_idx.shape[0]):
            base = w_off + np.int64(x_idx[j]) * n_out
            grow = gW[base:base + n_out]
            xv = x_val[j]
            for k in range(n_act):
                grow[ids[k]] += xv * delta[k]


@njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def rows_forward(W, B, w_off, b_off, n_in, in_dense, in_ids, in_vals, n_in_act,
                 dense, ids, n_act, relu, out):
    """z_k = b[j] + W[j] . h_in for each active neuron j (= ids[k], or k when dense)."""
    h = in_vals[:n_in_act]
    for k in range(n_act):
        j = k if dense else ids[k]
        base = w_off + np.int64(j) * n_in
        row = W[base:base + n_in]
        s = np.float32(0.0)
        if in_dense:
            for i in range(n_in):
                s += row[i] * h[i]
        else:
            for m in range(n_in_act):
                s += row[in_ids[m]] * h[m]
        s += B[b_off + j]
        if relu and s < 0.0:
            s = 0.0
        out[k] = s


@njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def rows_backward(W, gW, gB, spec, l, in_dense, in_ids, in_vals, n_in_act, dense, ids, n_act,
                  delta, d_in, accumulate):
    """Message passing back through layer ``l`` (its offsets and width from ``spec``).

    d_in = W[active]^T delta (weights as read in the forward pass: the optimizer runs only
    after the batch) and, when ``accumulate``, g[j] += delta_k * h_in, gb[j] += delta_k (racy
    adds). The output layer of a sampled network does not accumulate here: its gradient is
    formed per row after the batch from the stored deltas (slide.network.row_steps.batch_row_steps).
    ``d_in`` is not multiplied by the ReLU mask here; the caller does that.
    """
    w_off, b_off, n_in = spec.w_off[l], spec.b_off[l], spec.n_in[l]
    di = d_in[:n_in_act]
    h = in_vals[:n_in_act]
    for m in range(n_in_act):
        di[m] = 0.0
    for k in range(n_act):
        d = delta[k]
        if d == 0.0:
            continue
        j = k if dense else ids[k]
        base = w_off + np.int64(j) * n_in
        row = W[base:base + n_in]
        if accumulate:
            gB[b_off + j] += d
            grow = gW[base:base + n_in]
            if in_dense:
                for i in range(n_in):
                    di[i] += d * row[i]
                    grow[i] += d * h[i]
            else:
                for m in range(n_in_act):
                    c = in_ids[m]
                    di[m] += d * row[c]
                    grow[c] += d * h[m]
        else:
            if in_dense:
                for i in range(n_in):
                    di[i] += d * row[i]
            else:
                for m in range(n_in_act):
                    di[m] += d * row[in_ids[m]]
