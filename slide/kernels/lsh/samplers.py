"""Active-set samplers: given one query's L bucket ids, pick the neurons to compute.

``sample_into`` is a plain ``@njit`` kernel for the training engine's per-sample loop. Output
layout of ``out[:n_active]``:

1. the forced ids (true labels during training), in the given order, duplicates and ids outside
   ``[0, n_neurons)`` dropped;
2. up to ``budget`` ids from the LSH buckets that are not forced (the budget counts these only):
   * vanilla -- the L tables in a random order, each bucket's ids in table order, until
     ``budget`` new ids are collected or the tables run out (the paper's default);
   * topk -- ids ranked by how many of the L buckets contain them; the ``budget`` most frequent
     (ties at the cut broken from a random starting point);
   * threshold -- the ids found in at least ``threshold`` buckets, the most frequent first,
     capped at ``budget``;
3. uniformly random ids not already present until ``min_active`` ids in total (or n_neurons).

No duplicates, no ids out of range. Deduplication uses an open-addressing hash set in the caller's
scratch (``set_keys``/``set_counts``, power-of-two length); each call clears only the part of it
it needs (a power of two >= 2x the entries this call can insert), never an O(n_neurons) array.
Size the scratch with :func:`scratch_sizes` (or get it from :func:`make_scratch`).
"""
import numba
import numpy as np
import scipy.sparse as sp
from numba import prange

from slide.kernels.jit import njit
from slide.kernels.rng import STREAM_SAMPLE_BATCH, randint, stream_seed


SAMPLERS = {"vanilla": 0, "topk": 1, "threshold": 2}
VANILLA, TOPK, THRESHOLD = 0, 1, 2
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
# counts < 0 mark ids already in the active set (forced, selected or padded); occurrence counts
# added to them stay negative, so they never rank as candidates nor get padded in twice
_TAKEN = -(1 << 30)


def _pow2_at_least(n):
    p = 1
    while p < n:
        p <<= 1
    return p


@njit(cache=True, nogil=True, inline="always")
def _slot(key, mask):
    return np.int64(((np.uint64(key) * _GOLDEN) >> np.uint64(32)) & np.uint64(mask))


@njit(cache=True, nogil=True, inline="always")
def _set_add(set_keys, set_counts, mask, key, count):
    """Insert key with ``count`` or, when present, add ``count`` to its entry.
    Returns True when the key was new."""
    s = _slot(key, mask)
    while True:
        k = set_keys[s]
        if k == key:
            set_counts[s] += count
            return False
        if k < 0:
            set_keys[s] = key
            set_counts[s] = count
            return True
        s = (s + 1) & mask


@njit(cache=True, nogil=True, inline="always")
def _set_take(set_keys, set_counts, mask, key):
    """Claim key for the active set: True when it was absent (now inserted) or present but not
    yet taken (an unselected top-k candidate); either way it is marked taken."""
    s = _slot(key, mask)
    while True:
        k = set_keys[s]
        if k == key:
            if set_counts[s] < 0:
                return False
            set_counts[s] = _TAKEN
            return True
        if k < 0:
            set_keys[s] = key
            set_counts[s] = _TAKEN
            return True
        s = (s + 1) & mask


@njit(cache=True, nogil=True, inline="always")
def _set_count(set_keys, set_counts, mask, key, may_insert):
    """One probe: add 1 to key's count if present; else insert it with count 1 when
    ``may_insert``. Returns True when the key was inserted."""
    s = _slot(key, mask)
    while True:
        k = set_keys[s]
        if k == key:
            set_counts[s] += 1
            return False
        if k < 0:
            if may_insert:
                set_keys[s] = key
                set_counts[s] = 1
                return True
            return False
        s = (s + 1) & mask


@njit(cache=True, nogil=True, inline="always")
def _set_get(set_keys, set_counts, mask, key):
    s = _slot(key, mask)
    while True:
        k = set_keys[s]
        if k == key:
            return set_counts[s]
        if k < 0:
            return 0
        s = (s + 1) & mask


@njit(cache=True, nogil=True, inline="always")
def _vanilla_fill(codes, offsets, items, budget, rng_state, set_keys, set_counts, mask, limit,
                  order, out, n, used):
    """Vanilla: visit the tables in random order, take up to `budget` new ids from the buckets.

    Returns ``(n, used, rng_state)``."""
    L = min(codes.shape[0], order.shape[0])  # an undersized `order` visits fewer tables
    cap_out = out.shape[0]
    for l in range(L):
        order[l] = l
    for l in range(L - 1, 0, -1):
        rng_state, r = randint(rng_state, l + 1)
        tmp = order[l]
        order[l] = order[r]
        order[r] = tmp
    got = 0
    for ti in range(L):
        if got >= budget:
            break
        t = order[ti]
        b = codes[t]
        for p in range(offsets[t, b], offsets[t, b + 1]):
            if got >= budget or n >= cap_out or used >= limit:
                break
            v = items[t, p]
            if _set_take(set_keys, set_counts, mask, v):
                out[n] = v
                n += 1
                used += 1
                got += 1
    return n, used, rng_state


@njit(cache=True, nogil=True, inline="always")
def _counted_fill(sampler_code, codes, offsets, items, budget, threshold, rng_state, set_keys,
                  set_counts, mask, limit, order, out, n, used):
    """Top-k / threshold: count each candidate's buckets, take the most frequent first.

    Needs ``order.shape[0] > L + 1``. Returns ``(n, used, rng_state)``."""
    L = codes.shape[0]
    cap_out = out.shape[0]
    # count occurrences; distinct non-forced candidates go to order[:nc]
    hist0 = order.shape[0] - (L + 1)  # order[hist0 + c] = number of candidates seen c times
    nc = 0
    for t in range(L):
        b = codes[t]
        for p in range(offsets[t, b], offsets[t, b + 1]):
            v = items[t, p]
            if _set_count(set_keys, set_counts, mask, v, nc < hist0 and used < limit):
                order[nc] = v
                nc += 1
                used += 1
    minc = 1 if sampler_code == TOPK else max(threshold, 1)
    for c in range(L + 1):
        order[hist0 + c] = 0
    for i in range(nc):
        c = _set_get(set_keys, set_counts, mask, order[i])
        order[hist0 + min(c, L)] += 1
    room = min(budget, cap_out - n)
    # cut: the lowest count c* such that the candidates counted >= c* still fit, plus ties
    cut = L + 1
    above = 0
    while cut > minc and above + order[hist0 + cut - 1] <= room:
        cut -= 1
        above += order[hist0 + cut]
    # all candidates with count >= cut fit; fill the rest from the count == cut - 1 tier
    tie = cut - 1
    tie_room = room - above if tie >= minc else 0
    # counting sort of those by count, most frequent first: turn the histogram of counts
    # >= cut into start offsets (from the top count down)
    acc = 0
    for c in range(L, cut - 1, -1):
        h = order[hist0 + c]
        order[hist0 + c] = acc
        acc += h
    for i in range(nc):
        v = order[i]
        c = min(_set_get(set_keys, set_counts, mask, v), L)
        if c >= cut:
            out[n + order[hist0 + c]] = v
            order[hist0 + c] += 1
            _set_take(set_keys, set_counts, mask, v)
    n += above
    if tie_room > 0 and nc > 0:
        rng_state, start = randint(rng_state, nc)
        for q in range(nc):
            if tie_room == 0:
                break
            v = order[(start + q) % nc]
            if _set_get(set_keys, set_counts, mask, v) == tie:
                _set_take(set_keys, set_counts, mask, v)
                out[n] = v
                n += 1
                tie_room -= 1
    return n, used, rng_state


@njit(cache=True, nogil=True)
def sample_into(sampler_code, codes, offsets, items, n_neurons, budget, threshold, forced,
                min_active, rng_state, set_keys, set_counts, order, out):
    """Sample one active set (see the module doc). Returns ``(n_active, new rng_state)``.

    codes int32[L] (the query's bucket ids); offsets int32[L, 2**R + 1], items int32[L, N] (the
    index's tables); forced int32[:]; rng_state uint64; scratch set_keys/set_counts int32[S]
    (S a power of two), order int32[O]; out int32[C] with C >= active_capacity(...). The kernel
    never writes past C nor fills the set past half of S, so undersized scratch truncates the
    active set instead of corrupting memory."""
    L = codes.shape[0]
    cap_out = out.shape[0]
    # the largest power of two within the scratch
    full = 1
    while full * 2 <= set_keys.shape[0]:
        full *= 2
    nf = forced.shape[0]
    if sampler_code == VANILLA:
        need = nf + budget + min_active
    else:
        tot = 0
        for l in range(L):
            tot += offsets[l, codes[l] + 1] - offsets[l, codes[l]]
        need = nf + tot + min_active
    size = 2
    while size < 2 * need and size < full:
        size *= 2
    if size > full:
        size = full
    mask = size - 1
    limit = size // 2  # keep the load factor <= 1/2 so probes stay short and always terminate
    for s in range(size):
        set_keys[s] = -1
    n = 0
    used = 0
    for i in range(nf):
        f = forced[i]
        if f >= 0 and f < n_neurons and n < cap_out and used < limit:
            if _set_add(set_keys, set_counts, mask, f, _TAKEN):
                out[n] = f
                n += 1
                used += 1
    if sampler_code == VANILLA:
        n, used, rng_state = _vanilla_fill(codes, offsets, items, budget, rng_state, set_keys,
                                           set_counts, mask, limit, order, out, n, used)
    elif order.shape[0] > L + 1:
        n, used, rng_state = _counted_fill(sampler_code, codes, offsets, items, budget,
                                           threshold, rng_state, set_keys, set_counts, mask,
                                           limit, order, out, n, used)
    # padding: any id not yet in the active set (unselected candidates included), so the target
    # is always reachable; the set's load stays below half, which bounds `used`
    target = min(min_active, n_neurons, cap_out)
    while n < target and used < limit:
        rng_state, r = randint(rng_state, n_neurons)
        if _set_take(set_keys, set_counts, mask, np.int32(r)):
            out[n] = r
            n += 1
            used += 1
    return n, rng_state


# ----------------------------------------------------------------------------- sizing helpers

def _sampler_code(sampler):
    if isinstance(sampler, str):
        if sampler not in SAMPLERS:
            raise ValueError(f"unknown sampler {sampler!r}; expected one of {sorted(SAMPLERS)}")
        return SAMPLERS[sampler]
    code = int(sampler)
    if code not in SAMPLERS.values():
        raise ValueError(f"unknown sampler code {sampler!r}")
    return code


def _nonneg(name, v):
    if isinstance(v, (bool, np.bool_)) or int(v) != v or int(v) < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
    return int(v)


def active_capacity(budget, max_forced, min_active):
    """Length ``out`` needs: forced ids + budget sampled ids, or min_active if larger."""
    budget, max_forced, min_active = (_nonneg("budget", budget), _nonneg("max_forced", max_forced),
                                      _nonneg("min_active", min_active))
    return max(max_forced + budget, min_active, 1)


def scratch_sizes(sampler, L, bucket_size, budget, max_forced, min_active):
    """Scratch lengths for :func:`sample_into`: dict(capacity, set_size, order_size).

    ``bucket_size`` is the largest bucket the index can hold (its capacity). ``set_keys`` and
    ``set_counts`` need ``set_size`` (a power of two >= 2x the entries one call can insert),
    ``order`` needs ``order_size``, ``out`` needs ``capacity``."""
    code = _sampler_code(sampler)
    L, bucket_size = _nonneg("L", L), _nonneg("bucket_size", bucket_size)
    capacity = active_capacity(budget, max_forced, min_active)
    if code == VANILLA:
        entries = max_forced + budget + min_active
        order_size = max(L, 1)
    else:
        entries = max_forced + L * bucket_size + min_active
        order_size = L * bucket_size + L + 1
    return {"capacity": capacity, "set_size": _pow2_at_least(max(2 * entries, 2)),
            "order_size": order_size}


def make_scratch(sampler, L, bucket_size, budget, max_forced, min_active):
    """Allocate ``(set_keys, set_counts, order, out)`` for one thread."""
    s = scratch_sizes(sampler, L, bucket_size, budget, max_forced, min_active)
    return (np.full(s["set_size"], -1, dtype=np.int32), np.zeros(s["set_size"], dtype=np.int32),
            np.zeros(s["order_size"], dtype=np.int32), np.zeros(s["capacity"], dtype=np.int32))


# ----------------------------------------------------------------------------- batch sampling

@njit(cache=True, nogil=True, parallel=True)
def _sample_batch_kernel(sampler_code, codes, offsets, items, n_neurons, budget, threshold,
                         f_indptr, f_indices, min_active, seed, scratch, out, counts):
    """``sample_batch``'s kernel; ``scratch`` = (set_keys, set_counts, order), one row of each
    per thread (taken out of their tuple before the prange: Numba 0.68 drops a store made
    through a tuple member inside one)."""
    set_keys, set_counts, order = scratch
    for i in prange(codes.shape[0]):
        tid = numba.get_thread_id()
        # a row's draws never depend on its thread
        # int64 stream and index: a literal or the loop's uint64 index compiles stream_seed apart
        state = stream_seed(seed, np.int64(STREAM_SAMPLE_BATCH), np.int64(i))
        n, state = sample_into(sampler_code, codes[i], offsets, items, n_neurons, budget, threshold,
                               f_indices[f_indptr[i]:f_indptr[i + 1]], min_active, state,
                               set_keys[tid], set_counts[tid], order[tid], out[i])
        counts[i] = n


def sample_batch(sampler, codes, offsets, items, n_neurons, budget, threshold=1, forced=None,
                 min_active=0, seed=0):
    """Sample active sets for many queries in parallel (one scratch buffer per thread).

    ``codes`` int32[n, L] bucket ids (e.g. from ``hash_dense_batch``); ``forced`` None, a list of
    n integer arrays, or a scipy sparse matrix with n rows whose column indices are the forced ids.
    Returns ``(active int32[n, capacity] padded with -1, counts int32[n])``; row i's draws come
    from stream_seed(seed, _, i), so results do not depend on the number of threads."""
    code = _sampler_code(sampler)
    codes = np.ascontiguousarray(codes, dtype=np.int32)
    offsets = np.ascontiguousarray(offsets, dtype=np.int32)
    items = np.ascontiguousarray(items, dtype=np.int32)
    if codes.ndim != 2 or offsets.ndim != 2 or items.ndim != 2:
        raise ValueError("codes, offsets and items must be 2-D")
    n, L = codes.shape
    if offsets.shape[0] != L or items.shape[0] != L:
        raise ValueError(f"codes have {L} tables but offsets/items have "
                         f"{offsets.shape[0]}/{items.shape[0]}")
    if n and (codes.min() < 0 or codes.max() >= offsets.shape[1] - 1):
        raise ValueError(f"bucket ids must lie in [0, {offsets.shape[1] - 1})")
    n_neurons = _nonneg("n_neurons", n_neurons)
    if n_neurons < 1:
        raise ValueError("n_neurons must be positive")
    budget, min_active = _nonneg("budget", budget), _nonneg("min_active", min_active)
    threshold = _nonneg("threshold", threshold)
    if forced is None:
        f_indptr = np.zeros(n + 1, dtype=np.int64)
        f_indices = np.zeros(0, dtype=np.int32)
    elif sp.issparse(forced):
        forced = sp.csr_matrix(forced)
        if forced.shape[0] != n:
            raise ValueError(f"forced has {forced.shape[0]} rows, expected {n}")
        f_indptr = forced.indptr.astype(np.int64)
        f_indices = forced.indices.astype(np.int32)
    else:
        if len(forced) != n:
            raise ValueError(f"forced has {len(forced)} rows, expected {n}")
        rows = [np.asarray(f, dtype=np.int64).ravel() for f in forced]
        f_indptr = np.zeros(n + 1, dtype=np.int64)
        f_indptr[1:] = np.cumsum([len(r) for r in rows])
        f_indices = (np.concatenate(rows) if rows else np.zeros(0, np.int64))
        f_indices = f_indices.astype(np.int32) if f_indices.size else np.zeros(0, np.int32)
    if f_indices.size and (f_indices.min() < 0 or f_indices.max() >= n_neurons):
        raise ValueError(f"forced ids must lie in [0, {n_neurons})")
    max_forced = int(np.diff(f_indptr).max()) if n else 0
    bucket_size = int(np.diff(offsets, axis=1).max()) if offsets.size > L else 0
    s = scratch_sizes(code, L, bucket_size, budget, max_forced, min_active)
    nt = numba.config.NUMBA_NUM_THREADS
    set_keys = np.full((nt, s["set_size"]), -1, dtype=np.int32)
    set_counts = np.zeros((nt, s["set_size"]), dtype=np.int32)
    order = np.zeros((nt, s["order_size"]), dtype=np.int32)
    out = np.full((n, s["capacity"]), -1, dtype=np.int32)
    counts = np.zeros(n, dtype=np.int32)
    _sample_batch_kernel(code, codes, offsets, items, n_neurons, budget, threshold, f_indptr,
                         f_indices, min_active, np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF),
                         (set_keys, set_counts, order), out, counts)
    return out, counts
