"""The bundles the engine's kernels take (NamedTuples of arrays) and their allocation.

A kernel takes a handful of bundles instead of dozens of loose arrays; Numba compiles a
NamedTuple of arrays into a struct of array views, so reading ``sc.acts`` in a kernel costs what
reading a loose ``acts`` argument did.

* ``Params``   -- the flat weights and gradient buffers (``slide.kernels.layers`` layout).
* ``Spec``     -- the network's shape and sampling settings (layer offsets, sparse flags,
                  min_active, loss code, the packed LSH/sampler settings ``cfg``).
* ``Tables``   -- per-layer LSH arrays as typed lists (dummies for layers without tables).
* ``Scratch``  -- per-thread buffers (first axis: thread chunk) and per-sample active sets
                  (first axis: sample slot), with the layer offsets into them.
* ``Store``    -- the sampled output layer's per-sample input and deltas (row path).
* ``Csr``      -- a CSR matrix's (indptr, indices, data).
* ``Touched``  -- the touched-row lists of one batch and their never-cleared stamps.
* ``OutputRows`` -- the batch's output active sets transposed into per-row entry lists.
* ``SharedDraw`` -- one batch's shared negatives and their log importance weights.
* ``Extras``   -- the batched engine's per-sample work outside the shared block.
"""
from typing import NamedTuple

import numpy as np
from numba.typed import List

from slide.kernels.lsh.samplers import scratch_sizes


# cfg: the sparse layers' shared LSH / sampler settings, packed into one int64 array
CFG_SAMPLER, CFG_FAMILY, CFG_K, CFG_L, CFG_BITS, CFG_BUDGET, CFG_THRESHOLD = range(7)
SAMPLER_RANDOM = -1        # no LSH: labels + random neurons (classic sampled softmax)


class Params(NamedTuple):
    W: np.ndarray
    B: np.ndarray
    GW: np.ndarray
    GB: np.ndarray


class Spec(NamedTuple):
    n_layers: int
    n_in: np.ndarray
    n_out: np.ndarray
    w_off: np.ndarray
    b_off: np.ndarray
    sparse: np.ndarray
    min_active: np.ndarray
    loss_code: int
    cfg: np.ndarray


class Tables(NamedTuple):
    intp: object
    floatp: object
    toff: object
    titems: object


class Scratch(NamedTuple):
    a_off: np.ndarray        # layer l's activations/deltas at [a_off[l], a_off[l+1])
    s_off: np.ndarray        # layer l's active ids at [s_off[l], s_off[l+1]) (sparse layers)
    acts: np.ndarray         # [n_chunks, a_off[-1]] float32
    dels: np.ndarray         # [n_chunks, a_off[-1]] float32
    ids: np.ndarray          # [n_slots, s_off[-1]] int32
    n_act: np.ndarray        # [n_slots, n_layers] int64
    codes: np.ndarray        # [n_chunks, L] int32: bucket ids of the query
    set_keys: np.ndarray     # sampler hash set
    set_counts: np.ndarray
    order: np.ndarray
    xbuf: np.ndarray         # [n_chunks, max n_in of a sparse layer] float32, zero between uses
    marks: np.ndarray        # [n_chunks, n_layers, n] int64 stamps of the random fill
    forced_buf: np.ndarray   # [n_chunks, max forced] int32: positions in S of C's ids


class Store(NamedTuple):
    h_store: np.ndarray      # [batch, n_in of the output layer] float32
    d_store: np.ndarray      # [batch, output capacity] float32


class Block(NamedTuple):
    """The batched engine's per-fit buffers (``slide.network.block``): per sample its hidden
    activations and deltas, the column in the shared block S of each of its active output
    ids, its extras (active ids outside S) and counts; per thread a logit buffer; the block's
    weights, products and gradients."""
    acts: np.ndarray         # [batch, a_off[last]] float32: hidden layers, per sample
    dels: np.ndarray         # [batch, a_off[last]] float32
    col: np.ndarray          # [batch, output capacity] int32: column in S, -1: an extra
    extra: np.ndarray        # [batch, output capacity] int32: the extras' ids
    counts: np.ndarray       # [batch, 3] int64: n_c, n_s (select_active's layout), n_extra
    zbuf: np.ndarray         # [threads, output capacity] float32
    WS: np.ndarray           # [n_shared, h] float32: rows of S
    bS: np.ndarray           # [n_shared] float32
    Z: np.ndarray            # [batch, n_shared] float32: logits, then their deltas
    dH: np.ndarray           # [batch, h] float32
    dWS: np.ndarray          # [n_shared, h] float32
    dbS: np.ndarray          # [n_shared] float32
    forced: np.ndarray       # [threads, most labels + exact ids] int32: a sample's C ids
    # [batch, h1] float32: the first layer's deltas as whole rows (2+ hidden layers, copied
    # from dels; else empty)
    dels1: np.ndarray


class Extras(NamedTuple):
    """The output layer's per-sample work outside S in the batched engine
    (``slide.network.block``): each sample's input ``H`` and its extras' (active ids outside
    S) logits, then deltas, ``d``; and the extras of the samples with many of them (rows with
    hundreds of labels) cut into tasks that the products' parallel loops take beside their
    BLAS calls, so that one such sample does not hold up the threads."""
    W: np.ndarray            # the flat weights (``Params.W``)
    B: np.ndarray            # the flat biases
    w_off: np.int64          # the output layer's offsets into W and B
    b_off: np.int64
    extra: np.ndarray        # [batch, output capacity] int32: ``Block.extra``
    H: np.ndarray            # [batch, h] float32: the output layer's input
    d: np.ndarray            # [batch, output capacity] float32: the extras' logits, deltas
    tasks: np.ndarray        # [n_tasks, 3] int64: (sample, first extra, end) of each task
    ptr: np.ndarray          # [batch + 1] int64: sample s's tasks are tasks[ptr[s]:ptr[s+1]]
    part: np.ndarray         # [n_tasks, h] float32: each task's share of dH[s]


class Csr(NamedTuple):
    ptr: np.ndarray
    ind: np.ndarray
    dat: np.ndarray


class Touched(NamedTuple):
    stamp_rows: np.ndarray   # per row (layout.row_off): serial of the batch that last listed it
    stamp_bias: np.ndarray   # per bias
    starts: np.ndarray       # listed row i is W[starts[i]:starts[i] + lens[i]]
    lens: np.ndarray
    rowids: np.ndarray       # its index in the per-row arrays
    bias_ids: np.ndarray     # listed biases


class OutputRows(NamedTuple):
    stamp: np.ndarray        # per output neuron: serial of the batch that last updated it
    slot: np.ndarray         # per output neuron: its index in uniq (this batch)
    uniq: np.ndarray         # distinct active output neurons
    row_ptr: np.ndarray      # entries of uniq[u]: ent[row_ptr[u]:row_ptr[u+1]]
    ent: np.ndarray          # flat positions s * d_cap + k of (sample, active slot) pairs
    g_out: np.ndarray        # [threads, n_in + 1] float32 gradient scratch of the row steps


class FeatureRows(NamedTuple):
    """The batch's input features as per-feature entry lists (``touched.feature_entries``),
    for the batched engine's fused first-layer step (``slide.network.optim``)."""
    mark: np.ndarray         # [n_features] uint8 scratch, all-zero between batches
    slot: np.ndarray         # [n_features] int32: a feature's index in uniq (this batch)
    uniq: np.ndarray         # distinct features of the batch
    row_ptr: np.ndarray      # entries of uniq[u]: [row_ptr[u], row_ptr[u+1])
    ent_p: np.ndarray        # position of the entry's value in X's data
    ent_s: np.ndarray        # the entry's sample (position in the batch)
    g: np.ndarray            # [threads, n_hidden] float32 gradient scratch
    count: np.ndarray        # [1] int64: how many of uniq the latest listing filled


class DrawTables(NamedTuple):
    """A frequency draw's per-label arrays (``negatives.finish_draw``)."""
    cdf: np.ndarray          # [n_out] float64: cumulative tail distribution, last entry 1
    cdf_lo: np.ndarray       # [CDF_BUCKETS + 1] int64: the cdf's bucket index
    head: np.ndarray         # sorted int32 ids of the exact head


class SharedDraw(NamedTuple):
    ids: np.ndarray          # the batch's shared negatives, sorted, distinct, int32
    corr: np.ndarray         # per neuron: -log pi_j (pi_j = P(j in the draw)); empty: uniform
    corr_mix: np.ndarray     # per neuron: log((1 + 1/pi_j) / 2) (next to a random fill)
    n_draws: int             # draws made (|ids| <= n_draws)


def i64(a):
    return np.ascontiguousarray(a, dtype=np.int64)


def csr(M):
    return Csr(M.indptr, M.indices, M.data)


def empty_tables(n_layers):
    """Tables of a network without LSH (every entry a dummy)."""
    return pack_tables(n_layers, {})


def pack_tables(n_layers, indices):
    """Typed lists of the per-layer LSH arrays of ``indices`` (layer -> LSHIndex), as the
    kernels take them (dummies for layers without tables)."""
    di = np.zeros((1, 1), np.int32)
    df = np.zeros((1, 1), np.float32)
    intp, floatp, toff, titems = List(), List(), List(), List()
    for l in range(n_layers):
        idx = indices.get(l)
        if idx is None:
            intp.append(di)
            floatp.append(df)
            toff.append(di)
            titems.append(di)
        else:
            intp.append(idx.hf.int_params)
            floatp.append(idx.hf.float_params)
            toff.append(idx.offsets)
            titems.append(idx.items)
    return Tables(intp, floatp, toff, titems)


def capacity(spec, l, max_forced, min_act):
    """Most active neurons layer l can have for one sample."""
    n = int(spec.n_out[l])
    if not spec.sparse[l]:
        return n
    return min(n, max(max_forced + int(spec.cfg[CFG_BUDGET]), int(min_act), 1))


def make_scratch(spec, lsh, uses_tables, n_slots, n_chunks, n_forced, min_active, n_shared=0):
    """Per-thread and per-sample scratch for the kernels. ``lsh``: the network's LSH settings
    (sampler scratch sizes); ``n_forced``: most ids forced into the output layer (labels and
    shared negatives), ``n_shared`` of them shared negatives (the LSH sampler is queried with
    only the labels forced; the shared ones not in C are found by binary search,
    ``sample._append_shared``)."""
    L = spec.n_layers
    last = L - 1
    sparse = spec.sparse
    caps = [capacity(spec, l, n_forced if l == last else 0, min_active[l]) for l in range(L)]
    a_off = i64(np.concatenate([[0], np.cumsum(caps)]))
    s_off = i64(np.concatenate([[0], np.cumsum([caps[l] if sparse[l] else 0
                                                for l in range(L)])]))
    tot = int(a_off[-1])
    if uses_tables:
        sz = scratch_sizes(lsh["sampler"], lsh["L"], lsh["bucket_size"], lsh["budget"],
                           max(0, n_forced - n_shared), int(max(min_active)))
        set_size, order_size, n_codes = sz["set_size"], sz["order_size"], lsh["L"]
    else:
        set_size, order_size, n_codes = 1, 1, 1
    max_in = max([int(spec.n_in[l]) for l in range(1, L) if sparse[l]] or [1])
    # per-thread stamps for the random fill (never cleared: stamp == serial means taken)
    stamped = [l for l in range(L)
               if sparse[l] and (min_active[l] > 0 or not uses_tables
                                 or (l == last and n_shared > 0))]
    mlen = max([int(spec.n_out[l]) for l in stamped] or [1])
    return Scratch(
        a_off=a_off, s_off=s_off,
        acts=np.zeros((n_chunks, tot), np.float32),
        dels=np.zeros((n_chunks, tot), np.float32),
        ids=np.zeros((n_slots, max(1, int(s_off[-1]))), np.int32),
        n_act=np.zeros((n_slots, L), np.int64),
        codes=np.zeros((n_chunks, n_codes), np.int32),
        set_keys=np.full((n_chunks, set_size), -1, np.int32),
        set_counts=np.zeros((n_chunks, set_size), np.int32),
        order=np.zeros((n_chunks, order_size), np.int32),
        xbuf=np.zeros((n_chunks, max_in), np.float32),
        marks=np.zeros((n_chunks, L, mlen), np.int64),
        forced_buf=np.zeros((n_chunks, max(1, n_forced)), np.int32))


def make_store(sc, n_layers, n_in_last, batch_size, row_path):
    """The row path's per-sample output input/deltas (1 x 1 dummies without it)."""
    if not row_path:
        return Store(np.zeros((1, 1), np.float32), np.zeros((1, 1), np.float32))
    last = n_layers - 1
    cap = int(sc.a_off[last + 1] - sc.a_off[last])
    return Store(np.zeros((batch_size, int(n_in_last)), np.float32),
                 np.zeros((batch_size, cap), np.float32))


def make_block(sc, n_layers, n_in_last, batch_size, n_threads, n_shared, max_forced):
    """``Block`` buffers for batches of ``batch_size`` (``sc``: the fit's ``Scratch``)."""
    last = n_layers - 1
    n_hid = int(sc.a_off[last])
    cap = int(sc.a_off[last + 1] - sc.a_off[last])
    h = int(n_in_last)
    ns = max(int(n_shared), 1)
    return Block(acts=np.zeros((batch_size, n_hid), np.float32),
                 dels=np.zeros((batch_size, n_hid), np.float32),
                 col=np.zeros((batch_size, cap), np.int32),
                 extra=np.zeros((batch_size, cap), np.int32),
                 counts=np.zeros((batch_size, 3), np.int64),
                 zbuf=np.zeros((n_threads, cap), np.float32),
                 WS=np.zeros((ns, h), np.float32), bS=np.zeros(ns, np.float32),
                 Z=np.zeros((batch_size, ns), np.float32),
                 dH=np.zeros((batch_size, h), np.float32),
                 dWS=np.zeros((ns, h), np.float32), dbS=np.zeros(ns, np.float32),
                 forced=np.zeros((n_threads, max(int(max_forced), 1)), np.int32),
                 dels1=np.zeros((batch_size, int(sc.a_off[1] - sc.a_off[0])) if last > 1
                                else (0, 0), np.float32))


def make_output_rows(stamp, n_out_last, n_in_last, batch_size, cap, n_chunks):
    """OutputRows for batches of ``batch_size`` with ``cap`` output slots per sample;
    ``stamp`` (per output neuron) persists across fits: it marks the rows to rehash."""
    n_o = int(n_out_last)
    n_u = min(n_o, batch_size * cap)
    return OutputRows(stamp=stamp, slot=np.zeros(n_o, np.int32), uniq=np.zeros(n_u, np.int32),
                      row_ptr=np.zeros(n_u + 1, np.int64),
                      ent=np.zeros(batch_size * cap, np.int64),
                      g_out=np.zeros((n_chunks, int(n_in_last) + 1), np.float32))


def make_feature_rows(n_features, n_hidden, n_entries, n_threads):
    """FeatureRows for batches of at most ``n_entries`` input values."""
    n_f, n_e = int(n_features), max(int(n_entries), 1)
    n_u = min(n_f, n_e)
    return FeatureRows(mark=np.zeros(n_f, np.uint8), slot=np.zeros(n_f, np.int32),
                       uniq=np.zeros(n_u, np.int32), row_ptr=np.zeros(n_u + 1, np.int64),
                       ent_p=np.zeros(n_e, np.int64), ent_s=np.zeros(n_e, np.int32),
                       g=np.zeros((int(n_threads), int(n_hidden)), np.float32),
                       count=np.zeros(1, np.int64))


def make_touched(layout):
    n_rows = int(layout.row_off[-1])
    return Touched(stamp_rows=np.zeros(n_rows, np.int64),
                   stamp_bias=np.zeros(layout.n_biases, np.int64),
                   starts=np.zeros(n_rows, np.int64), lens=np.zeros(n_rows, np.int64),
                   rowids=np.zeros(n_rows, np.int64),
                   bias_ids=np.zeros(layout.n_biases, np.int64))
