"""One training batch: the HOGWILD kernel over its samples, then the optimizer step on the
rows it touched (buffered layers via ``collect_touched``, the sampled output layer via the
per-row path ``output_entries`` + ``SparseOptimizer.step_output``)."""
import numpy as np
import scipy.sparse as sp
from numba import prange

from slide.kernels.arrays import csr
from slide.kernels.jit import njit
from slide.kernels.layers import FASTMATH
from slide.kernels.rng import STREAM_SAMPLE, STREAM_SERIAL_STRIDE, stream_seed
from slide.kernels.sample import backward, forward, mark_stamp, sample_loss
from slide.kernels.touched import collect_touched, output_entries


@njit(cache=True, nogil=True, fastmath=FASTMATH, parallel=True, error_model="numpy")
def train_batch_kernel(params, spec, tables, sc, store, X, Y, rows, seed, serial, neg, row_path,
                       correct, losses, each):
    """Forward + backward of every sample of the batch ``rows``, HOGWILD over samples.

    Thread-chunk scratch: the first axis of sc.acts, dels, codes, ... ; per sample: sc.ids,
    sc.n_act (kept after the call: they list the touched rows) and ``store``. Gradients of the
    batch MEAN loss are added into GW/GB without locks. Random draws come from
    stream_seed(seed, serial, sample position): independent of threads. ``neg``: the batch's
    shared negatives (``SharedDraw``). A sample whose hidden layers are non-finite gets loss
    NaN and no gradient. ``each``: ``sample.output_loss``'s."""
    nb = rows.shape[0]
    n_chunks = sc.acts.shape[0]
    scale = 1.0 / nb
    for c in prange(n_chunks):
        lo = (c * nb) // n_chunks
        hi = ((c + 1) * nb) // n_chunks
        for s in range(lo, hi):
            r = rows[s]
            x_idx = X.ind[X.ptr[r]:X.ptr[r + 1]]
            x_val = X.dat[X.ptr[r]:X.ptr[r + 1]]
            labels = Y.ind[Y.ptr[r]:Y.ptr[r + 1]]
            rng = stream_seed(seed, STREAM_SAMPLE + serial * STREAM_SERIAL_STRIDE, s)
            ids = sc.ids[s]
            n_act = sc.n_act[s]
            finite, n_c, n_s = forward(params, spec, tables, sc, c, ids, n_act, x_idx, x_val,
                                       labels, neg.ids, rng, mark_stamp(serial, s))
            if not finite:
                losses[s] = np.nan
                continue
            losses[s] = sample_loss(spec, sc, c, ids, n_act, labels, neg, n_c, n_s, scale,
                                    correct, each)
            backward(params, spec, sc, c, ids, n_act, x_idx, x_val, row_path,
                     store.h_store[s], store.d_store[s])


def forward_backward(net, X, Y, rows, seed, serial):
    """Gradients of the batch mean loss into net.GW/GB (no update; on the row path the output
    layer's deltas and inputs go to ``net.store`` instead). Returns per-sample losses."""
    nb = rows.shape[0]
    sc = net.sc
    shared = net.negatives.draw(seed, serial)
    sc_b = sc._replace(ids=sc.ids[:nb], n_act=sc.n_act[:nb])
    train_batch_kernel(net.params, net.spec, net.tables, sc_b, net.store, csr(X), csr(Y), rows,
                       np.uint64(seed), np.int64(serial), net.negatives.bundle(shared),
                       net.row_path, net.correct, net.losses[:nb], net.loss_marker)
    return net.losses[:nb]


def touched(net, X, rows, serial):
    """List the rows of the buffered layers that batch ``rows`` touched into
    ``net.touched_rows`` (without the first layer's under ``net.fused_first``); returns
    (n_rows, n_bias)."""
    nb = rows.shape[0]
    sc = net.sc
    return collect_touched(net.spec, net.row_off, sc.s_off, sc.ids[:nb], sc.n_act[:nb],
                           csr(X), rows, net.touched_rows, np.int64(serial), net.row_path,
                           not net.fused_first)


def update(net, X, rows, serial, optimizer):
    """The optimizer step after ``forward_backward`` of the batch ``rows``: touched rows of
    the buffered layers, then the output layer's per-row path."""
    nb = rows.shape[0]
    sc = net.sc
    nr, nbias = touched(net, X, rows, serial)
    optimizer.step(net.params, net.touched_rows, nr, nbias)
    if net.row_path:
        last = net.layout.n_layers - 1
        nu = output_entries(sc.ids[:nb], sc.n_act[:nb], sc.s_off[last],
                            net.store.d_store.shape[1], net.out_rows, np.int64(serial))
        optimizer.step_output(net.W, net.B, net.out_rows, nu, net.store)


def one_sample(net, x_indices, x_data, labels, serial, return_active):
    """``Network.sample_loss_and_grads`` on a network whose GW/GB are fresh zero buffers and
    whose scratch may be replaced (the caller restores both)."""
    lay = net.layout
    x_indices = np.asarray(x_indices, np.int32)
    X = sp.csr_matrix((np.asarray(x_data, np.float32), x_indices,
                       np.array([0, len(x_indices)])), shape=(1, int(lay.sizes[0])))
    X.indptr = X.indptr.astype(np.int64)
    lab = np.sort(np.asarray(labels, np.int32))
    Y = sp.csr_matrix((np.ones(len(lab), np.float32), lab, np.array([0, len(lab)])),
                      shape=(1, int(lay.sizes[-1])))
    Y.indptr = Y.indptr.astype(np.int64)
    net.prepare(1, 1, max(1, len(lab)))
    loss = forward_backward(net, X, Y, np.zeros(1, np.int64), net.seed, serial)[0]
    GW = np.zeros(lay.n_weights, np.float32)
    GB = np.zeros(lay.n_biases, np.float32)
    GW[:net.GW.shape[0]] = net.GW
    GB[:net.GB.shape[0]] = net.GB
    sc = net.sc
    last = lay.n_layers - 1
    if net.row_path:
        # the output layer's gradient, as slide.network.row_steps.batch_row_steps forms it
        a = int(sc.s_off[last])
        n_i = int(lay.n_in[last])
        for k in range(int(sc.n_act[0, last])):
            j = int(sc.ids[0, a + k])
            d = net.store.d_store[0, k]
            o = int(lay.w_off[last]) + j * n_i
            GW[o:o + n_i] = d * net.store.h_store[0]
            GB[int(lay.b_off[last]) + j] = d
    if not return_active:
        return float(loss), GW, GB
    act = []
    for l in range(lay.n_layers):
        if net.sparse[l]:
            a = int(sc.s_off[l])
            act.append(sc.ids[0, a:a + int(sc.n_act[0, l])].copy())
        else:
            act.append(None)
    return float(loss), GW, GB, act
