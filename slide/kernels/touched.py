"""Which rows a batch touched: the optimizer visits only those.

Layer 0's rows are the batch's input features (row length n_out[0]); later layers' rows are
their active neurons (all of them for a dense layer). A sampled output layer (the row path)
is not listed here: ``output_entries`` transposes its active sets into per-row entry lists
for ``slide.network.row_steps.batch_row_steps``.
"""
import numpy as np

from slide.kernels.jit import njit
from slide.kernels.prefetch import LINE, prefetch_line


@njit(cache=True, nogil=True)
def _list_row(tb, nr, start, length, rowid):
    tb.starts[nr] = start
    tb.lens[nr] = length
    tb.rowids[nr] = rowid
    return nr + 1


@njit(cache=True, nogil=True)
def collect_touched(spec, row_off, s_off, ids, n_act, X, rows, tb, serial, row_path,
                    first_rows):
    """Deduplicated list of the rows (and biases) the batch ``rows`` touched, into the
    ``Touched`` bundle ``tb`` (its stamps are never cleared: stamp == serial means already
    listed in this batch). ``ids``/``n_act``: the batch's active sets (per sample).
    ``first_rows`` False: the first layer's rows (the batch's input features) are left out,
    its biases stay (the batched engine updates those rows by ``feature_entries`` and
    ``slide.network.row_steps.first_layer_step``). Returns (n_rows, n_bias)."""
    nr = np.int64(0)        # not a literal 0, which would compile _list_row apart
    nbias = 0
    nb = rows.shape[0]
    n0 = spec.n_out[0]
    for s in range(nb if first_rows else 0):
        r = rows[s]
        for p in range(X.ptr[r], X.ptr[r + 1]):
            f = X.ind[p]
            if tb.stamp_rows[row_off[0] + f] != serial:
                tb.stamp_rows[row_off[0] + f] = serial
                nr = _list_row(tb, nr, spec.w_off[0] + np.int64(f) * n0, n0, row_off[0] + f)
    n_upd = spec.n_layers - 1 if row_path else spec.n_layers
    for l in range(n_upd):
        b0 = spec.b_off[l]
        n_in = spec.n_in[l]
        if spec.sparse[l]:
            for s in range(nb):
                for k in range(n_act[s, l]):
                    j = ids[s, s_off[l] + k]
                    if tb.stamp_bias[b0 + j] != serial:
                        tb.stamp_bias[b0 + j] = serial
                        tb.bias_ids[nbias] = b0 + j
                        nbias += 1
                        if l > 0:
                            nr = _list_row(tb, nr, spec.w_off[l] + np.int64(j) * n_in, n_in,
                                           row_off[l] + j)
        else:
            for j in range(spec.n_out[l]):
                tb.bias_ids[nbias] = b0 + j
                nbias += 1
                if l > 0:
                    nr = _list_row(tb, nr, spec.w_off[l] + np.int64(j) * n_in, n_in,
                                   row_off[l] + j)
    return nr, nbias


@njit(cache=True, nogil=True)
def batch_entries(ptr, rows):
    """The number of stored values of CSR rows ``rows`` (``ptr``: the matrix's indptr)."""
    n = 0
    for r in rows:
        n += ptr[r + 1] - ptr[r]
    return n


@njit(cache=True, nogil=True, inline="always")
def _new_row(j, slot, uniq, row_ptr, nu):
    """Row j's first entry in the batch: it gets the next slot in ``uniq``, with a zero count;
    returns the number of unique rows so far. (Only for a new row: the count itself stays in
    the caller's loop, ``row_ptr[slot[j] + 1] += 1``, where passing a flag into a helper that
    does both made the whole loop 4x slower, measured.)"""
    slot[j] = nu
    uniq[nu] = j
    row_ptr[nu + 1] = 0
    return nu + 1


@njit(cache=True, nogil=True, inline="always")
def _counts_to_starts(row_ptr, nu):
    """row_ptr[1:nu+1] held each unique row's entry count: make row_ptr[u] its first entry's
    position (row_ptr[nu] the total), the fill's cursors."""
    row_ptr[0] = 0
    for u in range(nu):
        row_ptr[u + 1] += row_ptr[u]


@njit(cache=True, nogil=True, inline="always")
def _cursors_to_starts(row_ptr, nu):
    """After the fill advanced each cursor row_ptr[u] to its row's end: shift them back, so
    row u's entries are [row_ptr[u], row_ptr[u+1])."""
    for u in range(nu, 0, -1):
        row_ptr[u] = row_ptr[u - 1]
    row_ptr[0] = 0


@njit(cache=True, nogil=True)
def output_entries(ids, n_act, s_off_last, d_cap, orows, serial):
    """Transpose the batch's output-layer active sets into per-row lists (``OutputRows``).

    uniq[:n_uniq] = distinct active output neurons; for unique row u, ent[row_ptr[u]:
    row_ptr[u+1]] are the flat positions s * d_cap + k of its (sample, active slot) pairs, in
    sample order (so the per-row gradient sums are deterministic). ``stamp`` (never cleared)
    and ``slot`` are per-neuron scratch; stamp[j] = serial also records that row j is updated
    in this batch (the incremental rehash reads it). Returns n_uniq."""
    stamp, slot, uniq, row_ptr, ent = orows.stamp, orows.slot, orows.uniq, orows.row_ptr, \
        orows.ent
    nb = n_act.shape[0]
    last = n_act.shape[1] - 1
    nu = 0
    for s in range(nb):
        if s + 1 < nb:
            # the next sample's lines of the per-neuron arrays, as ``_prefetch_marks``
            for k in range(n_act[s + 1, last]):
                j = ids[s + 1, s_off_last + k]
                prefetch_line(stamp, j)
                prefetch_line(slot, j)
        for k in range(n_act[s, last]):
            j = ids[s, s_off_last + k]
            if stamp[j] != serial:
                stamp[j] = serial
                nu = _new_row(j, slot, uniq, row_ptr, nu)
            row_ptr[slot[j] + 1] += 1
    _counts_to_starts(row_ptr, nu)
    # fill, using row_ptr[u] as a cursor, then shift back
    for s in range(nb):
        for k in range(n_act[s, last]):
            u = slot[ids[s, s_off_last + k]]
            q = row_ptr[u]
            ent[q] = s * d_cap + k
            row_ptr[u] = q + 1
    _cursors_to_starts(row_ptr, nu)
    return nu


@njit(cache=True, nogil=True, inline="always")
def _prefetch_marks(X, rows, s, nb, mark, slot):
    """Before sample s's features are listed: the lines of ``mark`` and ``slot`` that sample
    s + 1's features will read, and the lines of sample s + 2's feature ids. Both arrays span
    every input feature, and after a batch's row steps swept the caches each entry's first
    read would miss. The listing is the same."""
    if s + 2 < nb:
        r2 = rows[s + 2]
        for p in range(X.ptr[r2], X.ptr[r2 + 1], LINE):
            prefetch_line(X.ind, p)
    if s + 1 < nb:
        r1 = rows[s + 1]
        for p in range(X.ptr[r1], X.ptr[r1 + 1]):
            f = X.ind[p]
            prefetch_line(mark, f)
            prefetch_line(slot, f)


@njit(cache=True, nogil=True)
def feature_entries(X, rows, frows):
    """Transpose the batch's input rows into per-feature entry lists (``FeatureRows``):
    uniq[:n_uniq] = the distinct features of the batch; for unique feature u,
    ent_p[row_ptr[u]:row_ptr[u+1]] are the positions of its values in ``X``'s data and ent_s
    the samples (batch positions) they belong to, in sample order (so each feature's gradient
    sum is deterministic). ``mark``/``slot`` are per-feature scratch; ``mark`` is all-zero
    again on return. Returns n_uniq, also left in ``frows.count[0]``."""
    mark, slot, uniq, row_ptr, ent_p, ent_s = (frows.mark, frows.slot, frows.uniq,
                                               frows.row_ptr, frows.ent_p, frows.ent_s)
    count = frows.count
    nu = 0
    nb = rows.shape[0]
    for s in range(nb):
        r = rows[s]
        _prefetch_marks(X, rows, s, nb, mark, slot)
        for p in range(X.ptr[r], X.ptr[r + 1]):
            f = X.ind[p]
            if mark[f] == 0:
                mark[f] = 1
                nu = _new_row(f, slot, uniq, row_ptr, nu)
            row_ptr[slot[f] + 1] += 1
    _counts_to_starts(row_ptr, nu)
    # fill, using row_ptr[u] as a cursor, then shift back
    for s in range(rows.shape[0]):
        r = rows[s]
        for p in range(X.ptr[r], X.ptr[r + 1]):
            u = slot[X.ind[p]]
            # the cursor read once: a store into ent_p (int64, as row_ptr) may alias it for
            # the compiler, which then reloads it for every use (4x slower, measured)
            q = row_ptr[u]
            ent_p[q] = p
            ent_s[q] = s
            row_ptr[u] = q + 1
    _cursors_to_starts(row_ptr, nu)
    for u in range(nu):
        mark[uniq[u]] = 0
    count[0] = nu
    return nu
