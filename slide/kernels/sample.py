"""One sample through the network: active-set selection, forward, loss, backward.

Per sample, in its thread's scratch (``Scratch`` row ``c``):

    h0 = relu(b0 + sum_j x_j W0T[j])                 layer 0: only x's nonzero features
    for each later layer: active = all neurons, or LSH sampler(h_in) (on the output layer:
                          the labels forced, then the shared negatives not yet in) padded
                          with random neurons to min_active;
                          z = W[active] h_in + b[active]   (only the active rows)
    softmax (or sigmoid) over the active logits; delta = p - y/|y|
    backward by message passing: g[active] += outer(delta, h_in); d_in = W[active]^T delta
    g0T[x.indices] += outer(x.data, d0)

``ids``/``n_act`` are the sample's own rows of ``Scratch.ids``/``Scratch.n_act`` (they outlive
the batch kernel: they list the touched rows).
"""
import math

import numpy as np

from slide.kernels.arrays import (CFG_BITS, CFG_BUDGET, CFG_FAMILY, CFG_K, CFG_L, CFG_SAMPLER,
                                  CFG_THRESHOLD, SAMPLER_RANDOM)
from slide.kernels.jit import njit
from slide.kernels.layers import (FASTMATH, first_backward, first_bias_backward,
                                  first_forward_dense, first_forward_sparse, rows_backward,
                                  rows_forward)
from slide.kernels.lsh.hashes import hash_dense_into, hash_sparse_into
from slide.kernels.lsh.samplers import sample_into
from slide.kernels.negatives import (corrected_logit, corrected_max, correction, is_label,
                                     seek_sorted)
from slide.kernels.losses import LOSS_SIGMOID, each_loss
from slide.kernels.rng import randint


# ----------------------------------------------------------------------------------------------
# Active sets
# ----------------------------------------------------------------------------------------------

# a sample's marks (which neurons its active set holds) are stamps, not flags: sample s of
# batch ``serial`` stamps with ``mark_stamp(serial, s)``, distinct for every sample of every
# batch while batches hold fewer rows than MARK_STRIDE (``batch_size``'s bound), so no sample
# clears the marks of the one before
MARK_STRIDE = 1 << 20


@njit(cache=True, nogil=True)
def mark_stamp(serial, s):
    """The active-set stamp of sample ``s`` of batch ``serial`` (never 0: unmarked)."""
    return serial * MARK_STRIDE + s + 1


@njit(cache=True, nogil=True, inline="always")
def _pad_random(ids, n, target, n_neurons, rng, mark, serial):
    """Append uniformly random neurons not yet in ``ids[:n]`` until ``target`` are present
    (``target`` <= n_neurons). ``mark`` is a per-thread stamp array that is never cleared:
    mark[j] == serial means j is already in the set, so no O(n_neurons) clearing per sample."""
    while n < target:
        rng, j = randint(rng, n_neurons)
        if mark[j] != serial:
            mark[j] = serial
            ids[n] = j
            n += 1
    return n, rng


@njit(cache=True, nogil=True)
def _add_labels(labels, out, mark, serial):
    """out[:n] = the distinct ``labels``, in order of first occurrence; returns n. Sorted
    labels (every caller's: CSR rows are canonical, and exact ids join them by a sorted
    union) are copied with equal neighbours once, unstamped: a stamp in the
    per-neuron ``mark`` array for each label (a cache miss each, thousands on a long
    debcontents row) only served the random fill, and ``_random_active`` stamps the whole
    set before one. Unsorted labels are deduplicated through ``mark`` (``_add_marked``)."""
    n = 0
    for i in range(labels.shape[0]):
        j = labels[i]
        if n > 0 and j <= out[n - 1]:
            if j == out[n - 1]:
                continue
            return _add_marked(labels, out, mark, serial)
        out[n] = j
        n += 1
    return n


@njit(cache=True, nogil=True)
def _add_marked(labels, out, mark, serial):
    """out[:n] = the distinct ``labels`` in order of first occurrence (stamped in ``mark``);
    returns n."""
    n = 0
    for i in range(labels.shape[0]):
        j = labels[i]
        if mark[j] != serial:
            mark[j] = serial
            out[n] = j
            n += 1
    return n


@njit(cache=True, nogil=True)
def _append_shared(out, n_c, shared, pos, write):
    """out[n_c:n] = the ids of ``shared`` (sorted, distinct) not among out[:n_c], in shared's
    order, up to out's capacity; returns n; the sorted positions in S of C's ids are left in
    the scratch ``pos`` (``block._active_columns`` takes them). ``write`` False (the batched
    engine's softmax, which reads a sample's S from the batch's block): S minus C is only
    counted, not copied, unless out's capacity cuts it (``_count_shared``). An ascending C is
    merged into S (``_merge_shared``); any other C has its ids looked up in S (a galloping
    search), and the walk over S is a plain copy between their positions, where stamping
    every id of S in the per-neuron ``mark`` array costs a cache miss per id at hundreds of
    thousands of neurons. The copy itself runs by segments, the
    runs of S between C's positions, each a slice assignment (a vectorised copy, where a walk
    testing every id against the next skipped position was scalar)."""
    if not write:
        n = _count_shared(out, n_c, shared, pos)
        if n <= out.shape[0]:
            return n
    if _ascending(out, n_c):
        return _merge_shared(out, n_c, shared, pos)
    n_in = _positions_in_shared(out, n_c, shared, pos)
    n = n_c
    cap = out.shape[0]
    lo = 0
    for q in range(n_in + 1):
        hi = pos[q] if q < n_in else shared.shape[0]
        m = min(hi - lo, cap - n)
        # an element loop, not a slice assignment: the slice's shape check compiles an error
        # path of its own, seconds of a cold compile
        for e in range(m):
            out[n + e] = shared[lo + e]
        n += m
        lo = hi + 1
    return n


@njit(cache=True, nogil=True)
def _count_shared(out, n_c, shared, pos):
    """The size ``_append_shared`` gives out[:n_c] with S appended (n_c + |S| - |C and S|,
    capacity aside), and C's sorted positions in S into ``pos``, without writing S: the
    batched engine's softmax takes a sample's S from the batch's block and reads only C's
    entries, so the copy of S's ~1,000 ids (and their columns, ``block._active_columns``)
    was a sample's largest piece of bookkeeping."""
    return n_c + shared.shape[0] - _positions_in_shared(out, n_c, shared, pos)


@njit(cache=True, nogil=True, inline="always")
def _positions_in_shared(out, n_c, shared, pos):
    """pos[:n] = the sorted positions in S of C's ids (out[:n_c], any order) that S holds, by
    a galloping search from a cursor (``seek_sorted``); returns n."""
    n_in = 0
    cur = 0
    for k in range(n_c):
        p, cur = seek_sorted(shared, out[k], cur)
        if p >= 0:
            pos[n_in] = p
            n_in += 1
    sort_small(pos, n_in)
    return n_in


@njit(cache=True, nogil=True, inline="always")
def _ascending(a, n):
    """Whether a[:n] is strictly ascending."""
    for k in range(1, n):
        if a[k] <= a[k - 1]:
            return False
    return True


@njit(cache=True, nogil=True)
def _merge_shared(out, n_c, shared, pos):
    """``_append_shared`` for an ascending C (the random sampler's: the sample's sorted
    labels): one merge of C into S copies S minus C and collects C's positions in S, in
    O(|C| + |S|) steps without a mispredicted search per id of C."""
    cap = out.shape[0]
    n = n_c
    n_in = 0
    k = 0
    for i in range(shared.shape[0]):
        v = shared[i]
        while k < n_c and out[k] < v:
            k += 1
        if k < n_c and out[k] == v:
            pos[n_in] = i
            n_in += 1
            k += 1
        elif n < cap:
            out[n] = v
            n += 1
    return n


@njit(cache=True, nogil=True, inline="always")
def sort_small(a, n):
    """Sort a[:n] in place (insertion sort: n is a sample's handful of labels)."""
    for i in range(1, n):
        v = a[i]
        k = i - 1
        while k >= 0 and a[k] > v:
            a[k + 1] = a[k]
            k -= 1
        a[k + 1] = v


@njit(cache=True, nogil=True)
def _mark_range(out, lo, hi, mark, serial):
    """Stamp out[lo:hi] in ``mark`` (before a random fill, which must draw around them)."""
    for k in range(lo, hi):
        mark[out[k]] = serial


@njit(cache=True, nogil=True)
def select_active(l, spec, tables, sc, c, in_sparse, in_ids, in_vals, n_in_act, labels, shared,
                  rng, serial, out, write_shared):
    """Active neurons of sparse layer ``l`` for one input vector; returns
    (count, rng, n_c, n_s) with the layout ``out[:count]`` =

        [0, n_c)      C: the ``labels`` (forced), then the LSH candidates (LSH samplers)
        [n_c, n_s)    the ``shared`` negatives not in C (``shared``: sorted, distinct ids,
                      as every draw gives them; in their order)
        [n_s, count)  uniform random fill up to min_active (none of them in C or shared)

    The LSH sampler is queried with only the labels forced, so C never depends on the shared
    draw: that is what makes the sampling correction unbiased (``negatives.correction``).
    The input is hashed with the layer's functions (a sparse input -- the network input or a
    sparse previous layer -- is scattered into the thread's ``xbuf`` and hashed densely, so
    unsorted active ids work too; ``xbuf`` is all-zero between calls). ``write_shared``
    False: the middle part (S minus C) is counted but left unwritten where the capacity does
    not cut it and no random fill can follow (``min_active`` 0; ``_append_shared``): the
    batched engine's softmax never reads it."""
    cfg = spec.cfg
    n_neurons = spec.n_out[l]
    min_act = spec.min_active[l]
    mark = sc.marks[c, l]
    code = cfg[CFG_SAMPLER]
    if tables is None:
        # a network without hash tables (``Network.tables`` is None: sampler "random"). Numba
        # prunes an ``is None`` test of an argument by its type before compiling, so this
        # specialisation never compiles the LSH hashing and sampling below (cold compile time)
        return _random_active(n_neurons, labels, shared, min_act, rng, out, mark, serial,
                              sc.forced_buf[c], write_shared)
    if code == SAMPLER_RANDOM:
        return _random_active(n_neurons, labels, shared, min_act, rng, out, mark, serial,
                              sc.forced_buf[c], write_shared)
    fam, K, Lh, bits = cfg[CFG_FAMILY], cfg[CFG_K], cfg[CFG_L], cfg[CFG_BITS]
    codes = sc.codes[c]
    intp = tables.intp[l]
    floatp = tables.floatp[l]
    if l == 0:
        # the network input: sorted CSR indices, hash it sparsely
        hash_sparse_into(fam, K, Lh, bits, intp, floatp, in_ids, in_vals, codes)
    elif in_sparse:
        xbuf = sc.xbuf[c]
        for m in range(n_in_act):
            xbuf[in_ids[m]] = in_vals[m]
        hash_dense_into(fam, K, Lh, bits, intp, floatp, xbuf[:spec.n_in[l]], codes)
        for m in range(n_in_act):
            xbuf[in_ids[m]] = 0.0
    else:
        hash_dense_into(fam, K, Lh, bits, intp, floatp, in_vals[:spec.n_in[l]], codes)
    n_c, rng = sample_into(code, codes, tables.toff[l], tables.titems[l], n_neurons,
                           cfg[CFG_BUDGET], cfg[CFG_THRESHOLD], labels, 0, rng, sc.set_keys[c],
                           sc.set_counts[c], sc.order[c], out)
    # the shared negatives and the random fill are added here (not by the sampler) so that
    # the caller knows which positions are which
    target = min(min_act, n_neurons, out.shape[0])
    # a random fill stamps the whole set first: S must be written wherever one may follow
    n = _append_shared(out, n_c, shared, sc.forced_buf[c], write_shared or target > 0)
    n_s = n
    if n < target:
        _mark_range(out, 0, n, mark, serial)
        n, rng = _pad_random(out, n, target, n_neurons, rng, mark, serial)
    return n, rng, n_c, n_s


@njit(cache=True, nogil=True)
def _random_active(n_neurons, labels, shared, min_act, rng, out, mark, serial, pos, write):
    """The active set without LSH: the labels, the shared ids not among them (``write``: as
    ``select_active``'s ``write_shared``), then random neurons up to ``min_act``; returns
    (count, rng, n_c, n_s) as ``select_active``."""
    n_lab = _add_labels(labels, out, mark, serial)
    target = min(min_act, n_neurons)
    # a random fill stamps the whole set first: S must be written wherever one may follow
    n_kept = _append_shared(out, n_lab, shared, pos, write or target > 0)
    n = n_kept
    if n < target:
        _mark_range(out, 0, n, mark, serial)
        n, rng = _pad_random(out, n, target, n_neurons, rng, mark, serial)
    return n, rng, min(labels.shape[0], n_kept), n_kept


# ----------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def forward(params, spec, tables, sc, c, ids, n_act, x_idx, x_val, labels, shared, rng, serial):
    """Forward pass of one sample into the thread's ``sc.acts[c]``; ``labels`` (forced, and
    queried with) and ``shared`` (added after the LSH ids) enter the output layer's active set,
    see ``select_active``. Returns (finite, n_c, n_s): ``finite`` is False when a hidden layer
    came out non-finite (a diverging run: it must not reach the hash functions; the caller
    reports NaN and nothing is updated); n_c, n_s: the last sparse layer's layout."""
    return forward_into(params, spec, tables, sc, c, sc.acts[c], ids, n_act, x_idx, x_val,
                        labels, shared, rng, serial, True)


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def forward_into(params, spec, tables, sc, c, acts, ids, n_act, x_idx, x_val, labels, shared,
                 rng, serial, compute_last):
    """``forward`` with the activations written to ``acts`` (the thread's row of ``sc.acts``,
    or a per-sample row: the batched engine keeps every sample's hidden layers until its
    backward pass) and the thread's scratch row ``c`` for the sampler. ``compute_last``
    False: the output layer's active set is selected but its logits are not computed (the
    batched engine computes them for the whole batch, ``slide.network.block``); then, but
    for the sigmoid loss, its part S minus C is not written where its size alone is needed
    (``select_active``'s ``write_shared``: the batched softmax reads only C's entries)."""
    W, B = params.W, params.B
    write_shared = compute_last or spec.loss_code == LOSS_SIGMOID
    n_layers = spec.n_layers
    last = n_layers - 1
    no_lab = labels[:0]
    no_shared = shared[:0]
    a_off, s_off = sc.a_off, sc.s_off
    n_c = n_s = 0
    n0 = spec.n_out[0]
    a0 = acts[a_off[0]:a_off[1]]
    if spec.sparse[0]:
        id0 = ids[s_off[0]:s_off[1]]
        # the input is sparse: a bool, not the literal True, which Numba would compile a
        # second signature of select_active for
        cnt, rng, n_c, n_s = select_active(np.int64(0), spec, tables, sc, c, np.bool_(True),
                                           x_idx, x_val, x_idx.shape[0],
                                           labels if last == 0 else no_lab,
                                           shared if last == 0 else no_shared, rng, serial,
                                           id0, write_shared)
        n_act[0] = cnt
        first_forward_sparse(W, B, spec.w_off[0], spec.b_off[0], n0, x_idx, x_val, id0, cnt,
                             a0)
    else:
        n_act[0] = n0
        first_forward_dense(W, B, spec.w_off[0], spec.b_off[0], n0, x_idx, x_val, a0)
    for l in range(1, n_layers):
        a_in = acts[a_off[l - 1]:a_off[l]]
        a_l = acts[a_off[l]:a_off[l + 1]]
        chk = np.float32(0.0)
        for m in range(n_act[l - 1]):
            chk += a_in[m] * np.float32(0.0)
        if chk != 0.0 or not np.isfinite(chk):
            for q in range(l, n_layers):
                n_act[q] = 0
            return False, n_c, n_s
        id_in = ids[s_off[l - 1]:s_off[l]]
        id_l = ids[s_off[l]:s_off[l + 1]]
        if spec.sparse[l]:
            cnt, rng, n_c, n_s = select_active(l, spec, tables, sc, c, spec.sparse[l - 1],
                                               id_in, a_in, n_act[l - 1],
                                               labels if l == last else no_lab,
                                               shared if l == last else no_shared, rng, serial,
                                               id_l, write_shared)
            n_act[l] = cnt
        else:
            n_act[l] = spec.n_out[l]
        if l == last and not compute_last:
            break
        rows_forward(W, B, spec.w_off[l], spec.b_off[l], spec.n_in[l], not spec.sparse[l - 1],
                     id_in, a_in, n_act[l - 1], not spec.sparse[l], id_l, n_act[l], l != last,
                     a_l)
    return True, n_c, n_s


# ----------------------------------------------------------------------------------------------
# Loss
# ----------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def output_loss(z, n_act, dense, ids, labels, loss_code, scale, delta, corr_ranges, corr,
                each):
    """Loss of one sample over its active logits z[:n_act]; writes scale * dLoss/dz to delta.

    softmax: cross-entropy against the target distribution 1/|y| on each true label (the SLIDE
    paper / TF baseline); sigmoid: binary cross-entropy summed over the active outputs;
    softmax_each (``each`` not None, ``slide.kernels.losses.loss_marker``): one softmax per true
    label over it and the active non-labels, averaged over the labels (``losses.each_loss``).
    ``corr_ranges`` = (lo1, hi1, lo2, hi2, log_w1, log_w2): logits at positions [lo1, hi1)
    are offset by log_w1 (+ corr[neuron] when ``corr`` is not empty), those at [lo2, hi2) by
    log_w2 (softmax only; see ``slide.kernels.negatives.correction``).
    """
    ny = labels.shape[0]
    if loss_code == LOSS_SIGMOID:
        return _sigmoid_loss(z, n_act, dense, ids, labels, scale, delta)
    if each is not None:
        return each_loss(z, n_act, dense, ids, labels, scale, delta, corr_ranges, corr)
    if ny == 0:
        # no target distribution: the sample contributes nothing
        for k in range(n_act):
            delta[k] = 0.0
        return 0.0
    zmax = corrected_max(z, n_act, ids, corr_ranges, corr)
    if not np.isfinite(zmax):
        # overflowed logits (a diverging run): report NaN, the engine stops before updating
        for k in range(n_act):
            delta[k] = 0.0
        return np.nan
    # one pass reads z (delta may alias z: the dense path computes in place)
    ssum = 0.0
    lz = 0.0
    n_found = 0
    for k in range(n_act):
        j = k if dense else ids[k]
        zk = corrected_logit(z[k] - zmax, k, ids, corr_ranges, corr)
        if is_label(labels, j):
            lz += zk
            n_found += 1
        e = math.exp(zk)
        delta[k] = e
        ssum += e
    inv = 1.0 / ssum
    logs = math.log(ssum)
    w = 1.0 / ny
    loss = -w * lz + w * n_found * logs
    for k in range(n_act):
        j = k if dense else ids[k]
        d = delta[k] * inv
        if is_label(labels, j):
            d -= w
        delta[k] = d * scale
    return loss


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def _sigmoid_loss(z, n_act, dense, ids, labels, scale, delta):
    """Binary cross-entropy summed over the active outputs; delta = scale * (p - y)."""
    loss = 0.0
    for k in range(n_act):
        j = k if dense else ids[k]
        zk = z[k]
        y = 1.0 if is_label(labels, j) else 0.0
        # stable BCE: max(z,0) - z*y + log(1 + exp(-|z|))
        loss += max(zk, 0.0) - zk * y + math.log1p(math.exp(-abs(zk)))
        if zk >= 0:
            p = 1.0 / (1.0 + math.exp(-zk))
        else:
            ez = math.exp(zk)
            p = ez / (1.0 + ez)
        delta[k] = (p - y) * scale
    return loss


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def sample_loss(spec, sc, c, ids, n_act, labels, neg, n_c, n_s, scale, correct, each):
    """Training loss of one forwarded sample; writes its output deltas to ``sc.dels[c]``.
    ``neg``: the batch's shared draw and its log importance weights (``arrays.SharedDraw``,
    see ``slide.kernels.negatives``); n_c, n_s: the output layer's layout (``forward``);
    ``correct``: apply the sampling correction; ``each``: ``output_loss``'s."""
    last = spec.n_layers - 1
    a0, a1 = sc.a_off[last], sc.a_off[last + 1]
    ranges, corr = correction(spec, n_act[last], n_c, n_s, neg,
                              correct and spec.sparse[last] and spec.loss_code != LOSS_SIGMOID)
    return output_loss(sc.acts[c, a0:a1], n_act[last], not spec.sparse[last],
                       ids[sc.s_off[last]:sc.s_off[last + 1]], labels, spec.loss_code, scale,
                       sc.dels[c, a0:a1], ranges, corr, each)


# ----------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def backward(params, spec, sc, c, ids, n_act, x_idx, x_val, row_path, h_store, d_store):
    """Back-propagate the output deltas of one sample, adding its gradients into GW/GB (racy,
    HOGWILD). With ``row_path`` the output layer's gradient is not accumulated: its input
    (dense form) goes to ``h_store`` and its deltas to ``d_store``, for the per-row pass after
    the batch (``slide.network.row_steps.batch_row_steps``)."""
    last = spec.n_layers - 1
    a_off, s_off = sc.a_off, sc.s_off
    acts = sc.acts[c]
    dels = sc.dels[c]
    sparse = spec.sparse
    if row_path:
        d_last = dels[a_off[last]:a_off[last + 1]]
        for k in range(n_act[last]):
            d_store[k] = d_last[k]
        a_in = acts[a_off[last - 1]:a_off[last]]
        if sparse[last - 1]:
            for i in range(spec.n_in[last]):
                h_store[i] = 0.0
            for m in range(n_act[last - 1]):
                h_store[ids[s_off[last - 1] + m]] = a_in[m]
        else:
            for i in range(spec.n_in[last]):
                h_store[i] = a_in[i]
    backward_from(params, spec, a_off, s_off, acts, dels, ids, n_act, x_idx, x_val, last,
                  not row_path, True)


@njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def backward_from(params, spec, a_off, s_off, acts, dels, ids, n_act, x_idx, x_val, top,
                  accumulate_top, first_weights):
    """Back-propagate one sample from layer ``top``'s deltas (``dels`` at layer ``top``) down
    to the input, adding the gradients into GW/GB (racy, HOGWILD); layer ``top``'s own weight
    gradient is added only with ``accumulate_top``, the first layer's weight gradient only with
    ``first_weights`` (else its deltas stay in ``dels`` for the fused step that forms it,
    ``slide.network.row_steps.first_layer_step``; its bias gradient is added either way).
    ``top`` = 0: the deltas of the first layer are already in place (the batched engine
    formed them from its block products)."""
    W, GW, GB = params.W, params.GW, params.GB
    sparse = spec.sparse
    for l in range(top, 0, -1):
        a_in = acts[a_off[l - 1]:a_off[l]]
        d_in = dels[a_off[l - 1]:a_off[l]]
        rows_backward(W, GW, GB, spec, l, not sparse[l - 1],
                      ids[s_off[l - 1]:s_off[l]], a_in, n_act[l - 1], not sparse[l],
                      ids[s_off[l]:s_off[l + 1]], n_act[l], dels[a_off[l]:a_off[l + 1]], d_in,
                      accumulate_top or l != top)
        for m in range(n_act[l - 1]):
            if a_in[m] <= 0.0:       # ReLU mask (a_in is the post-ReLU activation)
                d_in[m] = 0.0
    if first_weights:
        first_backward(GW, GB, spec.w_off[0], spec.b_off[0], spec.n_out[0], x_idx, x_val,
                       not sparse[0], ids[s_off[0]:s_off[1]], n_act[0], dels[a_off[0]:a_off[1]])
    else:
        first_bias_backward(GB, spec.b_off[0], spec.n_out[0], not sparse[0],
                            ids[s_off[0]:s_off[1]], n_act[0], dels[a_off[0]:a_off[1]])
