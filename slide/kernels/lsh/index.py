"""L hash tables over a layer's neurons in a compact CSR layout.

Table l is a CSR over bucket ids: the neurons in bucket b of table l are
``items[l, offsets[l, b]:offsets[l, b + 1]]``. Memory is O(L * (N + 2**range_pow)) -- at
Amazon-670K (N = 670,091, L = 50, range_pow = 18) 134 MB of items + 52 MB of offsets, where the
reference's dense ``L x 2**range_pow x bucket_size`` slots take 6.7 GB.

A table is built by a counting sort of all neurons by bucket id, capped at ``bucket_size`` per
bucket. Neurons are inserted in a random order (a permutation derived from (seed, table), see
:func:`insertion_order`) so that no neuron id range is systematically favoured when a bucket
overflows:

* FIFO keeps the ``bucket_size`` most recently inserted (the last ones in insertion order), in
  insertion order;
* reservoir keeps a uniform random subset (Algorithm R over the insertion order).

Unused tail entries of ``items[l]`` (beyond ``offsets[l, -1]``) are -1.
"""
import numpy as np
import scipy.sparse as sp
from numba import prange

from slide.kernels.jit import njit
from slide.kernels.lsh.hashes import (DOPH_DEFAULT_TOP, FAMILIES, _family_code, as_csr_arrays,
                                      draw_hash_functions, hash_dense_into, hash_sparse_into)
from slide.kernels.rng import (STREAM_ORDER, STREAM_REBUILD, STREAM_RESERVOIR, STREAM_TABLE_SEED,
                               derived_seed, randint, stream_seed)


POLICIES = {"fifo": 0, "reservoir": 1}
FIFO, RESERVOIR = 0, 1
STATE_FORMAT = 1


@njit(cache=True, nogil=True, parallel=True)
def hash_rows_into(family_code, K, L, bits, int_params, float_params, W, all_rows, rows, codes):
    """codes[r] = bucket ids of W[r] for r in ``rows`` (every row when ``all_rows``), in
    place: the same values as ``hash_dense_batch`` without copying the rows out of W or a
    scatter back."""
    if all_rows:
        for r in prange(W.shape[0]):
            hash_dense_into(family_code, K, L, bits, int_params, float_params, W[r], codes[r])
    else:
        for q in prange(rows.shape[0]):
            r = rows[q]
            hash_dense_into(family_code, K, L, bits, int_params, float_params, W[r], codes[r])


@njit(cache=True, nogil=True)
def insertion_order_into(seed, table, out):
    """Fill ``out`` (int32[N]) with the random insertion order of table ``table`` (Fisher-Yates
    from stream_seed(seed, _, table)): neuron out[0] is inserted first, out[N-1] last."""
    n = out.shape[0]
    for i in range(n):
        out[i] = i
    # int64 stream and index: a literal constant, or a parallel loop's uint64 index, would
    # each compile stream_seed once more (docs/design.md, "One compile a kernel")
    state = stream_seed(seed, np.int64(STREAM_ORDER), np.int64(table))
    for i in range(n - 1, 0, -1):
        state, r = randint(state, i + 1)
        tmp = out[i]
        out[i] = out[r]
        out[r] = tmp


def insertion_order(n_neurons, seed, table):
    """The order in which ``build_tables_into(..., seed, ...)`` inserts neurons into ``table``."""
    out = np.empty(int(n_neurons), dtype=np.int32)
    insertion_order_into(np.uint64(seed), int(table), out)
    return out


@njit(cache=True, nogil=True, parallel=True)
def build_tables_into(codes, bucket_size, policy_code, seed, offsets, items):
    """Fill the CSR tables from the bucket ids ``codes[N, L]`` (one prange task per table).

    ``offsets`` int32[L, n_buckets + 1], ``items`` int32[L, >= N] are overwritten. ``seed``
    (uint64) fixes the insertion orders and the reservoir draws: same seed, same tables.
    Each table first copies its column of ``codes`` into a contiguous array, so the counting
    pass and the random-order insertion pass read a 4N-byte column (2.7 MB at 670k neurons,
    cache-resident) instead of striding through the whole N x L matrix (134 MB) with a cache
    miss per neuron per pass."""
    N = codes.shape[0]
    L = codes.shape[1]
    nb = offsets.shape[1] - 1
    cap = bucket_size
    for l in prange(L):
        col = np.empty(N, dtype=np.int32)
        counts = np.zeros(nb, dtype=np.int32)
        for i in range(N):
            b = codes[i, l]
            col[i] = b
            counts[b] += 1
        offsets[l, 0] = 0
        for b in range(nb):
            offsets[l, b + 1] = offsets[l, b] + min(counts[b], cap)
        order = np.empty(N, dtype=np.int32)
        insertion_order_into(seed, l, order)
        seen = np.zeros(nb, dtype=np.int32)
        row = items[l]
        off = offsets[l]
        if policy_code == FIFO:     # FIFO: keep the last `cap` arrivals, in arrival order
            for r in range(N):
                i = order[r]
                b = col[i]
                s = seen[b]
                seen[b] = s + 1
                drop = counts[b] - cap
                if s >= drop:
                    row[off[b] + s - max(drop, 0)] = i
        else:                       # reservoir (Algorithm R), the same draws as the reference
            state = stream_seed(seed, np.int64(STREAM_RESERVOIR), np.int64(l))    # (as above)
            for r in range(N):
                i = order[r]
                b = col[i]
                s = seen[b]
                seen[b] = s + 1
                if s < cap:
                    row[off[b] + s] = i
                else:
                    state, q = randint(state, s + 1)
                    if q < cap:
                        row[off[b] + q] = i
        for p in range(off[nb], row.shape[0]):
            row[p] = -1


def _table_seed(seed, generation):
    return np.uint64(stream_seed(np.uint64(seed), STREAM_TABLE_SEED, int(generation)))


def _check_int(name, v, lo=None, hi=None):
    if isinstance(v, (bool, np.bool_)) or int(v) != v:
        raise ValueError(f"{name} must be an integer, got {v!r}")
    v = int(v)
    if lo is not None and v < lo:
        raise ValueError(f"{name} must be >= {lo}, got {v}")
    if hi is not None and v > hi:
        raise ValueError(f"{name} must be <= {hi}, got {v}")
    return v


class LSHIndex:
    """L hash tables of K concatenated LSH functions over the rows of a weight matrix.

    Attributes used by kernels: ``hf`` (HashFunctions), ``offsets``, ``items``, ``n_neurons``.
    ``generation`` counts builds; each build draws its insertion orders from (seed, generation)
    so successive rehashes do not keep dropping the same neurons from over-full buckets.
    """

    def __init__(self, family, dim, K, L, range_pow, bucket_size=128, policy="fifo", seed=0,
                 doph_top=DOPH_DEFAULT_TOP):
        if isinstance(policy, str):
            if policy not in POLICIES:
                raise ValueError(f"unknown bucket policy {policy!r}; expected one of "
                                 f"{sorted(POLICIES)}")
            self.policy_code = POLICIES[policy]
        else:
            self.policy_code = _check_int("policy", policy, 0, 1)
        self.bucket_size = _check_int("bucket_size", bucket_size, 1)
        self.seed = _check_int("seed", seed, 0)
        self.doph_top = _check_int("doph_top", doph_top, 1)
        self.hf = draw_hash_functions(family, dim, K, L, range_pow, self.seed,
                                      doph_top=self.doph_top)
        self.generation = 0
        self.n_neurons = 0
        self.offsets = None
        self.items = None
        self.codes = None        # cached bucket ids [n_neurons, L] of the last (re)hash

    # -- properties -----------------------------------------------------------------------
    family = property(lambda self: {v: k for k, v in FAMILIES.items()}[self.hf.family_code])
    dim = property(lambda self: self.hf.dim)
    K = property(lambda self: self.hf.K)
    L = property(lambda self: self.hf.L)
    range_pow = property(lambda self: self.hf.range_pow)
    policy = property(lambda self: {v: k for k, v in POLICIES.items()}[self.policy_code])

    @property
    def built(self):
        return self.offsets is not None

    def __repr__(self):
        return (f"LSHIndex({self.family!r}, dim={self.dim}, K={self.K}, L={self.L}, "
                f"range_pow={self.range_pow}, bucket_size={self.bucket_size}, "
                f"policy={self.policy!r}, seed={self.seed}, n_neurons={self.n_neurons})")

    # -- building -----------------------------------------------------------------------------
    def _check_weights(self, W, check_finite=True):
        W = np.asarray(W)
        if W.ndim != 2 or W.shape[1] != self.dim:
            raise ValueError(f"W must have shape (n_neurons, {self.dim}), got {W.shape}")
        if W.shape[0] < 1 or W.shape[0] >= 2**31 - 1:
            raise ValueError(f"W must have between 1 and 2**31 - 2 rows, got {W.shape[0]}")
        W = np.ascontiguousarray(W, dtype=np.float32)
        if check_finite and not np.all(np.isfinite(W)):
            raise ValueError("W contains non-finite values")
        return W

    def table_seed(self):
        """The uint64 seed ``build_tables_into`` used for the current tables."""
        return _table_seed(self.seed, self.generation)

    def ensure_tables(self, n):
        """Allocate (or keep, if the size matches) the CSR arrays for ``n`` neurons."""
        nb = 1 << self.range_pow
        if self.offsets is None or self.items.shape[1] != n:
            self.offsets = np.empty((self.L, nb + 1), dtype=np.int32)
            self.items = np.empty((self.L, n), dtype=np.int32)
        self.n_neurons = n

    def _hash_and_fill(self, W, dirty_rows):
        """Bucket ids of the rows of W into the cache (only ``dirty_rows`` when the cache holds
        the others; every row when None), then fill every table from the cache."""
        hf = self.hf
        shape = (W.shape[0], hf.L)
        if dirty_rows is None or self.codes is None or self.codes.shape != shape:
            if self.codes is None or self.codes.shape != shape:
                self.codes = np.empty(shape, np.int32)
            hash_rows_into(hf.family_code, hf.K, hf.L, hf.bits, hf.int_params, hf.float_params,
                           W, True, np.zeros(0, np.int64), self.codes)
        elif dirty_rows.shape[0]:
            hash_rows_into(hf.family_code, hf.K, hf.L, hf.bits, hf.int_params, hf.float_params,
                           W, False, np.ascontiguousarray(dirty_rows, np.int64), self.codes)
        self.ensure_tables(W.shape[0])
        build_tables_into(self.codes, self.bucket_size, self.policy_code, self.table_seed(),
                          self.offsets, self.items)

    def build(self, W):
        """Hash every row of ``W`` (float32[N, dim]) and fill every table. Returns self."""
        W = self._check_weights(W)
        self.generation = 0
        self._hash_and_fill(W, None)
        return self

    def rehash(self, W):
        """Reinsert every neuron with the same hash functions (after the weights moved)."""
        return self.refresh(self._check_weights(W), None)

    def refresh(self, W, dirty_rows=None):
        """Rehash: reinsert every neuron with the same hash functions, in the next
        generation's insertion order. Only the rows listed in ``dirty_rows`` (int array) are
        hashed again; the others reuse their cached bucket ids -- a neuron's ids are a function
        of its weights alone, so the tables are exactly those of a full rehash, provided the
        rows not listed did not change since the previous build/refresh. ``dirty_rows=None``
        (or no cache yet): every row. W is not scanned for non-finite values here (the engine
        never applies a non-finite update); ``rehash`` does scan. Returns self."""
        W = self._check_weights(W, check_finite=False)
        self.generation += 1
        self._hash_and_fill(W, dirty_rows)
        return self

    def rebuild(self, W, seed=None, check_finite=True):
        """Draw new hash functions and reinsert every neuron. The new seed is ``seed`` or, by
        default, derived from the current one (stream ``STREAM_REBUILD``): the seed travels in
        the checkpoint, so a resumed run draws the same functions. Returns self."""
        W = self._check_weights(W, check_finite)
        if seed is None:
            seed = derived_seed(self.seed, STREAM_REBUILD)
        self.seed = _check_int("seed", seed, 0)
        self.hf = draw_hash_functions(self.hf.family_code, self.dim, self.K, self.L, self.range_pow,
                                      self.seed, doph_top=self.doph_top)
        self.generation = 0
        self._hash_and_fill(W, None)
        return self

    # -- querying -----------------------------------------------------------------------------
    def _require_built(self):
        if not self.built:
            raise ValueError("the index is empty: call build(W) first")

    def query(self, x):
        """The L bucket ids of ``x``: a dense vector of length dim or a 1 x dim scipy sparse row."""
        hf = self.hf
        out = np.empty(hf.L, dtype=np.int32)
        if sp.issparse(x):
            if x.shape[0] != 1:
                raise ValueError(f"query takes one row, got shape {x.shape}")
            _, ind, val = as_csr_arrays(x, hf.dim)
            hash_sparse_into(hf.family_code, hf.K, hf.L, hf.bits, hf.int_params, hf.float_params,
                             ind, val, out)
            return out
        x = np.asarray(x)
        if x.ndim != 1 or x.shape[0] != hf.dim:
            raise ValueError(f"x must be a vector of length {hf.dim}, got shape {x.shape}")
        x = np.ascontiguousarray(x, dtype=np.float32)
        if not np.all(np.isfinite(x)):
            raise ValueError("x contains non-finite values")
        hash_dense_into(hf.family_code, hf.K, hf.L, hf.bits, hf.int_params, hf.float_params, x, out)
        return out

    def bucket(self, table, bucket_id):
        """The neuron ids in bucket ``bucket_id`` of table ``table``."""
        self._require_built()
        return self.items[table, self.offsets[table, bucket_id]:self.offsets[table, bucket_id + 1]]

    def candidates(self, x):
        """Sorted unique neuron ids found in the L buckets of ``x``."""
        self._require_built()
        codes = self.query(x)
        parts = [self.bucket(l, codes[l]) for l in range(self.L)]
        return np.unique(np.concatenate(parts)).astype(np.int32)

    def memory_bytes(self):
        """Bytes held by the tables and the hash parameters."""
        n = self.hf.int_params.nbytes + self.hf.float_params.nbytes
        if self.built:
            n += self.offsets.nbytes + self.items.nbytes
        return n

    # -- persistence --------------------------------------------------------------------------
    def state_dict(self):
        """A plain dict of numpy arrays and ints that reproduces this index exactly."""
        d = {
            "format": STATE_FORMAT,
            "family_code": int(self.hf.family_code), "dim": int(self.dim), "K": int(self.K),
            "L": int(self.L), "range_pow": int(self.range_pow),
            "bucket_size": int(self.bucket_size), "policy_code": int(self.policy_code),
            "seed": int(self.seed), "doph_top": int(self.doph_top),
            "generation": int(self.generation), "n_neurons": int(self.n_neurons),
            "int_params": self.hf.int_params.copy(), "float_params": self.hf.float_params.copy(),
        }
        if self.built:
            d["offsets"] = self.offsets.copy()
            d["items"] = self.items.copy()
        return d

    @classmethod
    def from_state(cls, d):
        """Rebuild an index from :meth:`state_dict` output; validates every field."""
        if not isinstance(d, dict):
            raise ValueError(f"state must be a dict, got {type(d).__name__}")
        need = ["format", "family_code", "dim", "K", "L", "range_pow", "bucket_size", "policy_code",
                "seed", "doph_top", "generation", "n_neurons", "int_params", "float_params"]
        missing = [k for k in need if k not in d]
        if missing:
            raise ValueError(f"LSH index state lacks {missing}")
        if int(d["format"]) != STATE_FORMAT:
            raise ValueError(f"unsupported LSH index state format {d['format']!r}")
        idx = cls(_family_code(int(d["family_code"])), int(d["dim"]), int(d["K"]), int(d["L"]),
                  int(d["range_pow"]), bucket_size=int(d["bucket_size"]),
                  policy=int(d["policy_code"]), seed=int(d["seed"]), doph_top=int(d["doph_top"]))
        ip = np.asarray(d["int_params"])
        fp = np.asarray(d["float_params"])
        if ip.shape != idx.hf.int_params.shape or not np.array_equal(ip, idx.hf.int_params):
            raise ValueError("LSH index state: int_params do not match the functions drawn from "
                             "its seed")
        if fp.shape != idx.hf.float_params.shape:
            raise ValueError("LSH index state: float_params have the wrong shape")
        idx.generation = _check_int("generation", d["generation"], 0)
        n = _check_int("n_neurons", d["n_neurons"], 0)
        if n > 0:
            if "offsets" not in d or "items" not in d:
                raise ValueError("LSH index state has n_neurons > 0 but no tables")
            off = np.ascontiguousarray(d["offsets"], dtype=np.int32)
            items = np.ascontiguousarray(d["items"], dtype=np.int32)
            nb = 1 << idx.range_pow
            if off.shape != (idx.L, nb + 1) or items.shape != (idx.L, n):
                raise ValueError(f"LSH index state: tables have shapes {off.shape}, {items.shape};"
                                 f" expected {(idx.L, nb + 1)}, {(idx.L, n)}")
            if (off[:, 0] != 0).any() or (np.diff(off, axis=1) < 0).any() or (off[:, -1] > n).any():
                raise ValueError("LSH index state: offsets are not a valid CSR")
            used = np.arange(n)[None, :] < off[:, -1:]
            if ((items < 0) | (items >= n))[used].any():
                raise ValueError("LSH index state: items hold neuron ids out of range")
            idx.offsets, idx.items, idx.n_neurons = off, items, n
        return idx
