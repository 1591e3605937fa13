"""How well the output layer's active set stands in for the full softmax (issue 14).

For a sample of rows, the full logits are computed once (BLAS over every output neuron) and
compared with the active set that training builds for each row:

(a) ``mass``    -- share of the full softmax mass exp(z_j) / sum_k exp(z_k) held by the active set;
(b) ``recall``  -- share of the row's true top-``k`` logits (k = 32) that are in the active set;
(c) ``sources`` -- how many active neurons are true labels / shared negatives / LSH candidates /
                   random padding;
(d) ``drift``   -- the share of the output neurons whose LSH bucket ids (in any table) changed
                   since the tables were last (re)built: a measure of how stale the tables are.

The active set is not re-implemented here: :func:`active_set` calls the engine's own kernel
(``slide.kernels.sample.select_active``) on a one-sample scratch, with the random stream, forced
ids and input the training kernel would use, so it is the training kernel's set by
construction; ``tests/test_diagnostics.py`` checks the plumbing against
``Network.sample_loss_and_grads(return_active=True)`` and a real ``forward_backward`` batch.
Only an output layer after dense hidden layers is supported (the default ``sparse_layers``).

Everything here runs outside the training kernels: switching it on costs one dense forward
pass of the sampled rows, nothing per batch.
"""

import numpy as np
import scipy.sparse as sp


from slide.kernels.arrays import SharedDraw, capacity, make_scratch
from slide.kernels.lsh.hashes import hash_dense_batch
from slide.kernels.negatives import correction, inclusion_weights
from slide.kernels.rng import STREAM_SAMPLE, STREAM_SERIAL_STRIDE, stream_seed
from slide.kernels.sample import select_active


# the kernel's layout order (slide.kernels.sample.select_active): labels and LSH ids (C, chosen
# without looking at the shared draw), the shared negatives not in C, the random padding
SOURCE_LABEL, SOURCE_LSH, SOURCE_SHARED, SOURCE_PAD = 0, 1, 2, 3
SOURCE_NAMES = ("labels", "lsh", "shared", "padding")


def _paired_rows(X, Y):
    """(X, Y) as CSR matrices with the same, non-zero number of rows (else ValueError)."""
    X = sp.csr_matrix(X)
    Y = sp.csr_matrix(Y)
    if X.shape[0] != Y.shape[0] or X.shape[0] == 0:
        raise ValueError(f"X and Y must have the same, non-zero number of rows; got "
                         f"{X.shape[0]} and {Y.shape[0]}")
    return X, Y


def _network(model):
    """The Network of a fitted SlideClassifier (or a Network itself), checked to have the
    supported shape: every layer dense except, possibly, the output layer."""
    net = getattr(model, "network_", model)
    if not hasattr(net, "layout") or not hasattr(net, "sparse"):
        raise ValueError("model must be a fitted SlideClassifier or a slide Network")
    if np.asarray(net.sparse)[:-1].any():
        raise ValueError("diagnostics support a sparse output layer only "
                         "(sparse_layers=None); this network samples a hidden layer")
    if net.uses_tables and not net.indices:
        raise ValueError("the network's LSH tables are not built yet (fit the model first)")
    return net


def _output_index(net):
    return net.indices.get(net.layout.n_layers - 1)


def _seed(model, net):
    """The seed the training kernel draws with (the estimator's ``seed_``)."""
    return int(getattr(model, "seed_", net.seed))


# ---------------------------------------------------------------------------------------------
# the active set of one sample
# ---------------------------------------------------------------------------------------------

def shared_negatives(model, serial):
    """The shared negatives of batch ``serial`` as the training kernel gets them (sorted,
    distinct int32); like training, this leaves their weights in ``net.negatives.corr``."""
    net = _network(model)
    return net.negatives.draw(_seed(model, net), serial)


def active_set(model, h, labels, shared, serial, position=0, max_labels=None):
    """The output-layer active set of one training sample, as the kernel builds it.

    h: the sample's last hidden layer (float32 [n_in]); labels: its sorted true labels;
    shared: the batch's shared negatives (:func:`shared_negatives`); serial / position: the
    batch serial and the sample's position in the batch (they seed the sampler's random
    draws); max_labels: the most labels of any row of the training set (sizes the kernel's
    output buffer; only matters when it binds, i.e. tiny output layers).

    Returns (ids int32[n], sources int8[n]) in the kernel's layout: labels, then LSH
    candidates (together C), then the shared negatives not in C, then random padding.
    """
    net = _network(model)
    last = net.layout.n_layers - 1
    n_out = int(net.n_out[last])
    if not net.sparse[last]:
        return np.arange(n_out, dtype=np.int32), np.full(n_out, SOURCE_PAD, np.int8)
    labels = np.ascontiguousarray(labels, np.int32)
    shared = np.ascontiguousarray(shared, np.int32)
    ml = max(1, len(labels) if max_labels is None else int(max_labels))
    n_forced = ml + net.n_shared
    # the training kernel's buffers for one sample (their sizes bound what the sampler keeps)
    sc = make_scratch(net.spec, net.lsh, net.uses_tables, 1, 1, n_forced, net.min_active,
                      net.n_shared)
    out = np.zeros(capacity(net.spec, last, n_forced, int(net.min_active[last])), np.int32)
    # numba hands the state back as a Python int: keep it uint64 (an int64 argument would
    # compile the kernel for int64 arithmetic and draw a different stream)
    rng = np.uint64(int(stream_seed(np.uint64(_seed(model, net)),
                                    np.int64(STREAM_SAMPLE + int(serial) * STREAM_SERIAL_STRIDE),
                                    np.int64(position))) & 0xFFFFFFFFFFFFFFFF)
    h = np.ascontiguousarray(h, np.float32)
    n, _, n_c, n_s = select_active(last, net.spec, net.tables, sc, 0, False,
                                   np.zeros(1, np.int32), h, h.shape[0], labels, shared, rng,
                                   np.int64(1), out, True)
    ids = out[:n].copy()
    n_lab = min(len(np.unique(labels)), n_c)
    src = np.full(n, SOURCE_PAD, np.int8)
    src[:n_lab] = SOURCE_LABEL
    src[n_lab:n_c] = SOURCE_LSH
    src[n_c:n_s] = SOURCE_SHARED
    return ids, src


# ---------------------------------------------------------------------------------------------
# per-row measures (brute force against the full logits)
# ---------------------------------------------------------------------------------------------

def full_logits(model, X):
    """Logits of every output neuron for the rows of X (float64 [n, n_labels])."""
    net = _network(model)
    Wo, bo = net.output_view()
    H = net.hidden(X)
    return H.astype(np.float64) @ Wo.T.astype(np.float64) + bo


def captured_mass(z, active):
    """Share of the softmax mass of the logits ``z`` (one row) held by the ids ``active``."""
    z = np.asarray(z, np.float64)
    e = np.exp(z - z.max())
    return float(e[np.unique(active)].sum() / e.sum())


def topk_recall(z, active, k=32):
    """Share of the ``k`` largest logits of ``z`` whose neuron is in ``active``."""
    z = np.asarray(z)
    k = min(int(k), z.shape[0])
    top = np.argpartition(-z, k - 1)[:k]
    return float(np.isin(top, active).mean())


def source_counts(sources):
    """{"labels": n, "shared": n, "lsh": n, "padding": n} of a ``sources`` array."""
    cnt = np.bincount(np.asarray(sources, np.int64), minlength=len(SOURCE_NAMES))
    return {name: int(cnt[i]) for i, name in enumerate(SOURCE_NAMES)}


# ---------------------------------------------------------------------------------------------
# the sampled softmax's normaliser
# ---------------------------------------------------------------------------------------------

def engine_log_offsets(net, ids, sources, log_inclusion):
    """The offsets the training kernel adds to the active logits (``sampling_correction``),
    from the engine's own rule (``slide.kernels.negatives.correction``, see there) applied to
    the active set ``ids`` with ``sources`` (:func:`active_set`'s layout) and inclusion
    probabilities ``log_inclusion[j]`` = log P(j in the shared set) (the kernel reads them in
    float32, as ``SharedNegatives.draw`` stores them). -inf marks ids the estimate leaves
    out (a random fill next to frequency negatives when the fill is not always present)."""
    ids = np.asarray(ids, np.int64)
    sources = np.asarray(sources)
    n_a = len(ids)
    off = np.zeros(n_a, np.float64)
    if not (net.correct and net.sparse[-1] and net.loss_code == 0):
        return off
    n_c = int(np.count_nonzero(sources <= SOURCE_LSH))
    n_s = n_c + int(np.count_nonzero(sources == SOURCE_SHARED))
    if net.negatives.power > 0:
        corr, corr_mix = inclusion_weights(np.exp(log_inclusion))
    else:
        corr = corr_mix = np.zeros(0, np.float32)
    neg = SharedDraw(np.zeros(0, np.int32), corr, corr_mix, int(net.n_shared))
    (lo1, hi1, lo2, hi2, w1, w2), c = correction(net.spec, n_a, n_c, n_s, neg, True)
    off[lo1:hi1] = w1
    if c.shape[0]:
        off[lo1:hi1] += c[ids[lo1:hi1]]
    off[lo2:hi2] = w2
    return off


def shared_log_inclusion(net, n_draws=None):
    """log P(j in the shared set) for every output neuron: 1 - (1 - q_j)^n for n draws with
    probability q_j (``negative_power`` > 0), as ``SharedNegatives.draw`` weights them."""
    neg = net.negatives
    n = int(net.n_shared - neg.n_head if n_draws is None else n_draws)
    q = neg.tail_q if neg.q is not None else None
    if q is None:
        n_out = int(net.n_out[-1])
        q = np.full(n_out, 1.0 / n_out)
    out = np.log(np.maximum(-np.expm1(n * np.log1p(-np.minimum(q, 1 - 1e-12))), 1e-300))
    out[neg.head] = 0.0          # the exact head is in every block
    return out


def normaliser_engine(z, ids, offsets):
    """The engine's estimate of sum_j exp(z_j): sum over the active set of exp(z + offset)."""
    z = np.asarray(z, np.float64)
    return float(np.exp(z[ids] + offsets).sum())


def normaliser_fixed(z, exact_ids, shared_ids, log_inclusion):
    """The unbiased estimate: exp(z_j) for every neuron of C = ``exact_ids`` (labels and LSH
    candidates, chosen without looking at the shared draw), plus Horvitz-Thompson
    exp(z_j) / P(j in S) for each shared negative j NOT in C. E over the draw of S equals
    sum_j exp(z_j) exactly, because each j outside C enters with probability P(j in S)."""
    z = np.asarray(z, np.float64)
    c = np.unique(np.asarray(exact_ids, np.int64))
    s = np.setdiff1d(np.unique(np.asarray(shared_ids, np.int64)), c)
    return float(np.exp(z[c]).sum() + np.exp(z[s] - log_inclusion[s]).sum())


# ---------------------------------------------------------------------------------------------
# LSH code drift
# ---------------------------------------------------------------------------------------------

def stored_codes(index):
    """Bucket id of each neuron in each table as the tables hold it (int32 [N, L]; -1 where a
    capped bucket dropped the neuron)."""
    n = int(index.n_neurons)
    out = np.full((n, index.L), -1, np.int32)
    nb = index.offsets.shape[1] - 1
    for t in range(index.L):
        off = index.offsets[t]
        bucket = np.repeat(np.arange(nb, dtype=np.int32), np.diff(off))
        out[index.items[t, :off[-1]], t] = bucket
    return out


def current_codes(model):
    """Bucket ids [N, L] of the output neurons' current weights under the current functions."""
    net = _network(model)
    idx = _output_index(net)
    if idx is None:
        raise ValueError("the output layer has no LSH tables (sampler='random' or 'dense')")
    Wo, _ = net.output_view()
    return hash_dense_batch(idx.hf, np.ascontiguousarray(Wo))


def codes_drift(before, after):
    """Drift between two code arrays [N, L] (-1 = unknown, skipped): dict(neurons = share of
    neurons with any known code changed, codes = share of known (neuron, table) codes
    changed)."""
    before = np.asarray(before)
    after = np.asarray(after)
    if before.shape != after.shape:
        raise ValueError(f"code arrays differ in shape: {before.shape} vs {after.shape}")
    known = (before >= 0) & (after >= 0)
    changed = (before != after) & known
    n_known = int(known.sum())
    neurons = known.any(axis=1)
    return {"neurons": float(changed.any(axis=1)[neurons].mean()) if neurons.any() else 0.0,
            "codes": float(changed.sum() / n_known) if n_known else 0.0}


def code_drift(model):
    """(d): drift of the output neurons' codes since the tables were last (re)built."""
    net = _network(model)
    return codes_drift(stored_codes(_output_index(net)), current_codes(net))


# ---------------------------------------------------------------------------------------------
# everything at once
# ---------------------------------------------------------------------------------------------

def diagnose(model, X, Y, n_rows=256, k=32, serial=None, seed=0, max_labels=None):
    """Diagnostics (a)-(d) on ``n_rows`` rows of (X, Y) drawn with ``seed``, treated as one
    batch with serial ``serial`` (default: the next batch of a fitted model).

    Returns dict(rows, mass, recall, active, sources (mean counts), normaliser_ratio (engine
    estimate / exact, mean over rows), drift (None without tables))."""
    net = _network(model)
    if not net.sparse[-1]:
        raise ValueError("the output layer is dense: every neuron is active")
    X, Y = _paired_rows(X, Y)
    n_rows = int(n_rows)
    if n_rows < 1:
        raise ValueError(f"n_rows must be >= 1, got {n_rows}")
    rows = np.sort(np.random.default_rng(seed).permutation(X.shape[0])[:n_rows])
    Xs = X[rows]
    Xs.indptr = Xs.indptr.astype(np.int64)
    Ys = Y[rows]
    if serial is None:
        serial = int(getattr(model, "batches_", 0)) + 1
    if max_labels is None:
        # the training kernel's buffers are sized by the training set's most labels per row
        key = getattr(net, "_scratch_key", None)
        max_labels = key[2] if key is not None else int(np.diff(Y.indptr).max())
    shared = shared_negatives(model, serial)
    log_inc = shared_log_inclusion(net)
    H = net.hidden(Xs)
    Z = full_logits(net, Xs)
    mass, rec, ratio = [], [], []
    srcs = np.zeros(len(SOURCE_NAMES))
    for i in range(len(rows)):
        lab = np.sort(Ys.indices[Ys.indptr[i]:Ys.indptr[i + 1]]).astype(np.int32)
        ids, src = active_set(model, H[i], lab, shared, serial, i, max_labels)
        mass.append(captured_mass(Z[i], ids))
        rec.append(topk_recall(Z[i], ids, k))
        srcs += np.bincount(src.astype(np.int64), minlength=len(SOURCE_NAMES))
        zmax = Z[i].max()
        exact = np.exp(Z[i] - zmax).sum()
        off = engine_log_offsets(net, ids, src, log_inc)
        ratio.append(normaliser_engine(Z[i] - zmax, ids, off) / exact)
    n = len(rows)
    out = {"rows": n, "mass": float(np.mean(mass)), "recall": float(np.mean(rec)),
           "active": float(srcs.sum() / n),
           "sources": {name: float(srcs[j] / n) for j, name in enumerate(SOURCE_NAMES)},
           "normaliser_ratio": float(np.mean(ratio)), "drift": None}
    if net.uses_tables:
        out["drift"] = code_drift(net)
    return out


def format_diagnostics(d):
    """One log line of :func:`diagnose`'s result."""
    s = d["sources"]
    line = (f"diag rows={d['rows']} mass={d['mass']:.3f} recall@32={d['recall']:.3f} "
            f"active={d['active']:.0f} (labels {s['labels']:.1f}, shared {s['shared']:.0f}, "
            f"lsh {s['lsh']:.0f}, pad {s['padding']:.0f}) Zhat/Z={d['normaliser_ratio']:.3f}")
    if d["drift"] is not None:
        line += f" drift={d['drift']['neurons']:.3f}"
    return line


# ---------------------------------------------------------------------------------------------
# switching it on during training
# ---------------------------------------------------------------------------------------------

def every(n_batches, X, Y, n_rows=200, log=print, k=32, seed=0):
    """A ``fit(callback=...)`` callable that logs :func:`diagnose` on ``n_rows`` rows of (X, Y)
    every ``n_batches`` batches: (a) captured softmax mass, (b) top-``k`` recall, (c) active
    neurons by source, (d) LSH code drift, and the normaliser's ratio, one line each time
    (:func:`format_diagnostics`). The rows are the same every time (drawn with ``seed``), the
    shared negatives those of the next batch. It never stops the fit and leaves the training
    itself unchanged. The results are also kept, as (batch, dict) pairs, in the callable's
    ``history`` list.

    Example: ``model.fit(X, Y, callback=slide.network.diagnostics.every(100, X, Y))``."""
    try:
        n_batches = int(n_batches)
    except (TypeError, ValueError):
        raise ValueError(f"n_batches must be a positive integer, got {n_batches!r}") from None
    if n_batches < 1:
        raise ValueError(f"n_batches must be >= 1, got {n_batches}")
    if int(n_rows) < 1:
        raise ValueError(f"n_rows must be >= 1, got {n_rows}")
    if not callable(log):
        raise ValueError("log must be callable (e.g. print or logging.info)")
    X, Y = _paired_rows(X, Y)

    def callback(model, info):
        if info["batch"] % n_batches == 0:
            d = diagnose(model, X, Y, n_rows=n_rows, k=k, serial=info["batch"] + 1, seed=seed)
            callback.history.append((info["batch"], d))
            log(f"batch {info['batch']}: " + format_diagnostics(d))
        return False

    callback.history = []
    return callback


def first_layer_gradient(net, X, rows):
    """The first layer's weight gradient of the batch ``rows`` [n_features, n_hidden] as the
    fused step (``row_steps.first_layer_step``) forms it from the per-sample deltas, after
    ``forward_backward`` (for tests and diagnostics: training never builds it densely)."""
    nb = rows.shape[0]
    a0, a1 = int(net.sc.a_off[0]), int(net.sc.a_off[1])
    return np.asarray(X[rows].T @ net.block.dels[:nb, a0:a1], np.float32)
