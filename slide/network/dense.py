"""The full-softmax reference path (``sampler="dense"``): hidden layers per sample in
kernels, the output layer as BLAS matrix products over the whole batch (as TensorFlow computes
it), hidden backward per sample (HOGWILD). Numerically the per-sample path with every neuron
active."""
import math

import numba
import numpy as np
from numba import prange

from slide.kernels.arrays import csr
from slide.kernels.expsum import exp_shifted_inplace, max_and_finite
from slide.kernels.jit import njit
from slide.kernels.layers import (FASTMATH, first_backward, first_forward_dense, rows_backward,
                                  rows_forward)
from slide.kernels.losses import LOSS_SOFTMAX
from slide.kernels.sample import output_loss


NO_CORRECTION = (0, 0, 0, 0, 0.0, 0.0)


@njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def hidden_forward(W, B, spec, x_idx, x_val, h_off, a):
    """Every hidden layer (all neurons) of one sample: a[h_off[l]:h_off[l+1]] = layer l's
    output, l < n_layers - 1."""
    dummy = np.zeros(1, dtype=np.int32)
    first_forward_dense(W, B, spec.w_off[0], spec.b_off[0], spec.n_out[0], x_idx, x_val,
                        a[h_off[0]:h_off[1]])
    for l in range(1, spec.n_layers - 1):
        rows_forward(W, B, spec.w_off[l], spec.b_off[l], spec.n_in[l], True, dummy,
                     a[h_off[l - 1]:h_off[l]], spec.n_in[l], True, dummy, spec.n_out[l], True,
                     a[h_off[l]:h_off[l + 1]])


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True)
def dense_hidden_kernel(params, spec, h_off, X, rows, acts):
    """Hidden layers of the batch ``rows``: acts[s] as in ``hidden_forward``."""
    for s in prange(rows.shape[0]):
        r = rows[s]
        hidden_forward(params.W, params.B, spec, X.ind[X.ptr[r]:X.ptr[r + 1]],
                       X.dat[X.ptr[r]:X.ptr[r + 1]], h_off, acts[s])


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True)
def dense_backward_kernel(params, spec, h_off, X, rows, acts, d_hidden, dels):
    """Back-propagate d_hidden[s] (dLoss/d last hidden output, ReLU mask applied) through the
    hidden layers into GW/GB (racy adds, HOGWILD). ``dels`` [n_chunks, h_off[-1]]."""
    W, GW, GB = params.W, params.GW, params.GB
    nb = rows.shape[0]
    last = spec.n_layers - 1
    n_chunks = dels.shape[0]
    dummy = np.zeros(1, dtype=np.int32)
    for c in prange(n_chunks):
        dl = dels[c]
        for s in range((c * nb) // n_chunks, ((c + 1) * nb) // n_chunks):
            r = rows[s]
            a = acts[s]
            for i in range(spec.n_in[last]):
                dl[h_off[last - 1] + i] = d_hidden[s, i]
            for l in range(last - 1, 0, -1):
                d_in = dl[h_off[l - 1]:h_off[l]]
                rows_backward(W, GW, GB, spec, l, True,
                              dummy, a[h_off[l - 1]:h_off[l]], spec.n_in[l], True, dummy,
                              spec.n_out[l], dl[h_off[l]:h_off[l + 1]], d_in, True)
                for m in range(spec.n_in[l]):
                    if a[h_off[l - 1] + m] <= 0.0:
                        d_in[m] = 0.0
            first_backward(GW, GB, spec.w_off[0], spec.b_off[0], spec.n_out[0],
                           X.ind[X.ptr[r]:X.ptr[r + 1]], X.dat[X.ptr[r]:X.ptr[r + 1]], True,
                           dummy, spec.n_out[0], dl[h_off[0]:h_off[1]])


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True, error_model="numpy")
def dense_loss_kernel(Z, Y, rows, loss_code, scale, losses, each):
    """In place: Z[s] (logits of the whole output layer) becomes scale * dLoss/dZ; losses[s]
    gets the sample's loss. Same loss as the sampled path, fused into one pass per row
    (``each``: ``sample.output_loss``'s)."""
    n = Z.shape[1]
    empty = np.zeros(0, np.float32)
    for s in prange(rows.shape[0]):
        r = rows[s]
        labels = Y.ind[Y.ptr[r]:Y.ptr[r + 1]]
        if loss_code == LOSS_SOFTMAX and each is None:
            losses[s] = softmax_row(Z[s], labels, scale)
        else:
            losses[s] = output_loss(Z[s], n, True, labels, labels, loss_code, scale, Z[s],
                                    NO_CORRECTION, empty, each)


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def softmax_row(z, labels, scale):
    """``output_loss``'s softmax over a whole row of logits z (every label active, no
    correction), in place and in vectorised passes: the general kernel's one scalar pass with
    a label test per logit and libm's exp was most of the dense baseline's batch. Equal to it
    to float rounding (``tests/test_network.py`` checks the dense path against the per-sample
    one). ``labels``: the row's sorted, distinct labels."""
    ny = labels.shape[0]
    zmax, finite = max_and_finite(z)
    if ny == 0 or not finite:
        # no target distribution (contributes nothing), or overflowed logits (a diverging
        # run: NaN, the engine stops before updating)
        for k in range(z.shape[0]):
            z[k] = 0.0
        return 0.0 if ny == 0 else np.nan
    lz = 0.0
    for i in range(ny):
        lz += np.float64(z[labels[i]]) - zmax
    ssum = exp_shifted_inplace(z, zmax)
    f = np.float32(scale / ssum)
    for k in range(z.shape[0]):
        z[k] *= f
    wl = np.float32(scale / ny)
    for i in range(ny):
        z[labels[i]] -= wl
    return -lz / ny + math.log(ssum)


def train_batch_dense(net, X, Y, rows, serial, optimizer):
    """The dense network's batch on ``net`` (a ``slide.network.Network``): hidden forward,
    output layer by BLAS, loss, output gradient by BLAS, hidden backward, then the same sparse
    optimizer (every output row is touched). Returns (mean loss, output size)."""
    lay = net.layout
    last = lay.n_layers - 1
    nb = rows.shape[0]
    h_off = np.concatenate([[0], np.cumsum(lay.sizes[1:-1])]).astype(np.int64)
    key = ("dense", nb)
    if getattr(net, "_dense_key", None) != key:
        net._dense_acts = np.zeros((nb, int(h_off[-1])), np.float32)
        net._dense_dels = np.zeros((numba.get_num_threads(), int(h_off[-1])), np.float32)
        net._dense_key = key
    acts = net._dense_acts
    Xc, params, spec = csr(X), net.params, net.spec
    dense_hidden_kernel(params, spec, h_off, Xc, rows, acts)
    H = acts[:, int(h_off[last - 1]):int(h_off[last])]
    Wo, bo = net.output_view()
    Z = H @ Wo.T
    Z += bo
    losses = np.zeros(nb, np.float64)
    dense_loss_kernel(Z, csr(Y), rows, net.loss_code, 1.0 / nb, losses, net.loss_marker)
    loss = float(np.mean(losses))
    if not math.isfinite(loss):
        return loss, float(lay.sizes[-1])
    np.matmul(Z.T, H, out=lay.weight_view(net.GW, last))
    lay.bias_view(net.GB, last)[:] = Z.sum(axis=0)
    dH = Z @ Wo
    dH *= H > 0
    dense_backward_kernel(params, spec, h_off, Xc, rows, acts,
                          np.ascontiguousarray(dH, dtype=np.float32), net._dense_dels)
    net.update(X, rows, serial, optimizer)
    return loss, float(lay.sizes[-1])
