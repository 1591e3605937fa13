"""LSH hash families over neuron weight rows and layer inputs: SimHash, WTA, DWTA, DOPH.

Each family is described by a :class:`HashFunctions` tuple of flat arrays drawn from an explicit
seed. The kernels ``hash_dense_into`` / ``hash_sparse_into`` are plain ``@njit`` functions that a
caller's own kernels (the training engine's per-sample loop) can call; they allocate nothing and
need no scratch. Both go through one function of the families (``_hash_tables``) that reads a
vector's entries either way, so the dense and sparse forms of a vector get exactly the same
codes (a weight row hashed densely must land where a query hashed sparsely looks); dense
SimHash alone has a path of its own, a product with its projections as a matrix. DOPH alone
allocates small buffers per call (see below).

A table's bucket id is the concatenation of its K codes of ``bits`` bits each:
``id = code_0 << (K-1)*bits | ... | code_{K-1}``, so ids lie in
``[0, 2**(K*bits)) c [0, 2**range_pow)``.

Families (all hashes of all tables are numbered ``j = l*K + k``):

* ``simhash`` -- signed random projections; projection j reads each dimension d with probability
  1/3 (a random third of the dimensions, the SLIDE reference's ratio 3) with a random sign, i.e.
  coefficient +1 or -1 with probability 1/6 each and 0 otherwise, decided by a counter hash of
  (key_j, d). 1 bit: sign of <a_j, x> > 0.
  Dense hashing multiplies by a precomputed dense +-1/0 matrix (vectorised); sparse hashing
  evaluates the counter hash for each nonzero of x (O(K*L*nnz), no O(dim) state at dim ~ 800k).
* ``wta`` -- winner take all: random permutations of the dimensions cut into bins of 8; hash j is
  the position (0..7) of the largest entry of bin j (first one on ties). 3 bits. Sparse inputs read
  absent entries as 0 (binary search in the sorted CSR indices). The C++ reference indexes the
  wrong array here; this one reads ``x[bin[j, s]]``.
* ``dwta`` -- densified WTA for ReLU / sparse inputs: zero entries are treated as absent; a bin
  with no nonzero entry is empty and borrows the code of another bin chosen by a universal hash of
  (j, attempt), up to 100 attempts, else code 0. 3 bits, packed with the full 3-bit shift.
* ``doph`` -- densified one-permutation minhash over the set S(x) of the top coordinates: the
  positive entries of x that are >= the t-th largest positive entry (ties all included; for a
  binary input S is simply its support). Table l hashes every element of S with a universal hash
  u_l into one of K bins; the code of bin k is the low ``bits`` bits of the minimum u_l in the
  bin (b-bit minwise hashing of the argmin element); empty bins borrow from another bin of the same
  table (universal-hash probing, up to 100 attempts). ``bits = range_pow // K``.
  Cost O(n) to find S (one quickselect) plus O(L * |S|) for the minima. DOPH is the one family
  whose kernels allocate: buffers of about 3n + K words per call (n = dim, or nnz if sparse).
"""
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from numba import prange

from slide.kernels.jit import njit
from slide.kernels.topk import select_inplace
from slide.kernels.rng import STREAM_DOPH, STREAM_DWTA, STREAM_SIMHASH, splitmix64, stream_seed


FAMILIES = {"simhash": 0, "wta": 1, "dwta": 2, "doph": 3}
_FAMILY_NAMES = {v: k for k, v in FAMILIES.items()}

SIMHASH, WTA, DWTA, DOPH = 0, 1, 2, 3
BIN_SIZE = 8  # WTA / DWTA bin size; log2(8) = 3 bits per code
WTA_BITS = 3
MAX_PROBES = 100  # densification attempts before falling back to code 0
DOPH_DEFAULT_TOP = 32
MAX_RANGE_POW = 30
# Dense SimHash keeps the projections as a dense float32 [K*L, dim] matrix of +-1/0 while it has at
# most this many entries (128 MB); beyond it (huge dim x K x L) dense hashing evaluates the
# counter hash for each nonzero of x instead. A dense +-1/0 row dot product vectorises, which is
# ~25x faster than walking a list of a third of the dimensions with a gather.
SIMHASH_MATRIX_LIMIT = 1 << 25

_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_MASK32 = np.uint64(0xFFFFFFFF)
# "no element in this bin" (a hash equals it with probability 2**-64)
_EMPTY_BIN = np.uint64(0xFFFFFFFFFFFFFFFF)


class HashFunctions(NamedTuple):
    family_code: int
    dim: int
    K: int
    L: int
    range_pow: int
    bits: int
    seed: int
    int_params: np.ndarray    # 2-D int32, layout per family (see draw_hash_functions)
    float_params: np.ndarray  # 2-D float32 (SimHash projections; 1x1 dummy for the others)


def _family_code(family):
    if isinstance(family, str):
        if family not in FAMILIES:
            raise ValueError(f"unknown hash family {family!r}; expected one of {sorted(FAMILIES)}")
        return FAMILIES[family]
    code = int(family)
    if code not in _FAMILY_NAMES:
        raise ValueError(f"unknown hash family code {family!r}; expected one of "
                         f"{sorted(_FAMILY_NAMES)}")
    return code


def bits_per_hash(family, K, range_pow):
    """Bits of one hash code: SimHash 1, WTA/DWTA 3, DOPH range_pow // K."""
    code = _family_code(family)
    if code == SIMHASH:
        return 1
    if code in (WTA, DWTA):
        return WTA_BITS
    return int(range_pow) // max(int(K), 1)


def check_hash_config(family, K, L, range_pow):
    """Raise ValueError unless K hashes of ``family`` fit into a bucket id of range_pow bits."""
    code = _family_code(family)
    name = _FAMILY_NAMES[code]
    for nm, v in (("K", K), ("L", L), ("range_pow", range_pow)):
        if int(v) != v or int(v) < 1:
            raise ValueError(f"{nm} must be a positive integer, got {v!r}")
    K, L, range_pow = int(K), int(L), int(range_pow)
    if range_pow > MAX_RANGE_POW:
        raise ValueError(f"range_pow={range_pow} is too large (at most {MAX_RANGE_POW}: "
                         "bucket ids are int32)")
    if code == DOPH:
        if K > range_pow:
            raise ValueError(f"K={K} DOPH hashes need at least 1 bit each ({K} bits) but "
                             f"range_pow={range_pow}")
        return
    bits = bits_per_hash(code, K, range_pow)
    if K * bits > range_pow:
        raise ValueError(
            f"K={K} {name.upper()} hashes need {K * bits} bits but range_pow={range_pow}"
            f" (at most K={range_pow // bits} for {name})")


# ----------------------------------------------------------------------------- small helpers

@njit(cache=True, nogil=True, inline="always")
def _mix3(key, a, b):
    """A 64-bit hash of (key, a, b): a universal-style hash for coefficients and probing."""
    s = key ^ (np.uint64(a) * _MIX1) ^ (np.uint64(b) * _MIX2)
    _, z = splitmix64(s)
    return z


@njit(cache=True, nogil=True, inline="always")
def _below(z, n):
    """Map a random uint64 to [0, n) by multiply-shift on its high 32 bits."""
    return np.int64(((z >> np.uint64(32)) * np.uint64(n)) >> np.uint64(32))


@njit(cache=True, nogil=True, inline="always")
def _key(int_params, row):
    """The uint64 key stored as (hi, lo) int32 in columns 0, 1 of ``row``."""
    hi = np.uint64(np.uint32(int_params[row, 0]))
    lo = np.uint64(np.uint32(int_params[row, 1]))
    return (hi << np.uint64(32)) | lo


def _split_key(key):
    key = int(key) & 0xFFFFFFFFFFFFFFFF
    hi = np.uint32(key >> 32).view(np.int32)
    lo = np.uint32(key & 0xFFFFFFFF).view(np.int32)
    return int(hi), int(lo)


@njit(cache=True, nogil=True, inline="always")
def _simhash_coef(key, d):
    """Coefficient of dimension d in the projection with this key: 0 with probability 2/3 (the
    projection reads a random third of the dimensions), else +1 or -1 with equal odds."""
    r = _below(_mix3(key, d, 0), 6)
    if r == 0:
        return 1.0
    if r == 1:
        return -1.0
    return 0.0


@njit(cache=True, nogil=True, inline="always")
def _sparse_lookup(indices, values, d):
    """x[d] of a CSR row with sorted indices (0.0 when absent), by binary search."""
    lo = 0
    hi = indices.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if indices[mid] < d:
            lo = mid + 1
        else:
            hi = mid
    if lo < indices.shape[0] and indices[lo] == d:
        return values[lo]
    return 0.0


# ----------------------------------------------------------------------------- per-family codes

@njit(cache=True, nogil=True, fastmath=True)
def _dot(a, x):
    """<a, x> accumulated in float32 (fastmath lets it vectorise; a is a row of +-1/0)."""
    s = np.float32(0.0)
    for d in range(x.shape[0]):
        s += a[d] * x[d]
    return s


@njit(cache=True, nogil=True, inline="always")
def _entry(ids, vals, dense, d):
    """x[d] of the vector whose entries are ``vals`` (``dense``: at coordinates 0, 1, ...;
    else a CSR row's, at the sorted coordinates ``ids``; 0.0 where absent)."""
    if dense:
        return vals[d]
    return _sparse_lookup(ids, vals, d)


@njit(cache=True, nogil=True, inline="always")
def _wta_code(int_params, j, ids, vals, dense):
    """Position (0..7) of the largest entry of bin j (the first on ties)."""
    best = _entry(ids, vals, dense, int_params[j, 0])
    pos = 0
    for s in range(1, BIN_SIZE):
        v = _entry(ids, vals, dense, int_params[j, s])
        if v > best:
            best = v
            pos = s
    return pos


@njit(cache=True, nogil=True, inline="always")
def _dwta_raw(int_params, j, ids, vals, dense):
    """Argmax position over the nonzero entries of bin j, or -1 when the bin is empty."""
    pos = -1
    best = np.float32(0.0)
    for s in range(BIN_SIZE):
        v = _entry(ids, vals, dense, int_params[j, s])
        if v != 0 and (pos < 0 or v > best):
            best = v
            pos = s
    return pos


@njit(cache=True, nogil=True, inline="always")
def _doph_finish(key, K, bits, mins):
    """Bucket id of one table from its K bin minima; empty bins borrow from the bin a universal
    hash of (bin, attempt) points at (optimal densification), up to MAX_PROBES attempts."""
    mask = np.uint64((1 << bits) - 1)
    bid = 0
    for k in range(K):
        code = 0
        if mins[k] != _EMPTY_BIN:
            code = np.int64(mins[k] & mask)
        else:
            for attempt in range(1, MAX_PROBES + 1):
                kk = _below(_mix3(key, k, attempt + 1), K)
                if mins[kk] != _EMPTY_BIN:
                    code = np.int64(mins[kk] & mask)
                    break
        bid = (bid << bits) | code
    return bid


@njit(cache=True, nogil=True)
def _doph_tables(K, L, bits, int_params, ids, vals, dense, out):
    """DOPH bucket ids of the vector with entries ``vals`` at coordinates ``ids[i]`` (or ``i``
    when ``dense``).

    The top set S = the positive entries >= the t-th largest positive entry (ties included) is
    found with one quickselect, O(n); then each table hashes S once into its K bins, O(|S|).
    This is the one family whose kernels allocate: buffers of about 3n + K words per call."""
    n = vals.shape[0]
    t = int_params[L, 0]
    pos = np.empty(n, dtype=np.float32)
    cnt = 0
    for i in range(n):
        if vals[i] > 0:
            pos[cnt] = vals[i]
            cnt += 1
    if cnt == 0:  # no positive entry: an empty set hashes to bucket 0 everywhere
        out[:] = 0
        return
    if cnt <= t:
        thr = pos[:cnt].min()
    else:
        thr = select_inplace(pos, cnt, cnt - t)  # the t-th largest, with multiplicity
    S = np.empty(cnt, dtype=np.int64)
    m = 0
    for i in range(n):
        if vals[i] > 0 and vals[i] >= thr:
            S[m] = i if dense else ids[i]
            m += 1
    mins = np.empty(K, dtype=np.uint64)
    for l in range(L):
        key = _key(int_params, l)
        mins[:] = _EMPTY_BIN
        for e in range(m):
            u = _mix3(key, S[e], 1)
            k = _below(u, K)
            if u < mins[k]:
                mins[k] = u
        out[l] = _doph_finish(key, K, bits, mins)


_NO_IDS = np.zeros(1, dtype=np.int32)


@njit(cache=True, nogil=True)
def _hash_tables(family_code, K, L, bits, int_params, ids, vals, dense, out):
    """The L bucket ids of the vector with entries ``vals`` (``dense``: at coordinates 0, 1,
    ...; else at the sorted coordinates ``ids``, a CSR row) into ``out``, for every family
    (SimHash evaluating its coefficients on the fly). The dense and sparse forms of a vector
    read the same nonzero entries in the same order, so they get the same ids, bit for bit."""
    KL = K * L
    if family_code == SIMHASH:
        for l in range(L):
            bid = 0
            for k in range(K):
                key = _key(int_params, l * K + k)
                s = 0.0
                for p in range(vals.shape[0]):
                    v = vals[p]
                    if v != 0:
                        s += _simhash_coef(key, p if dense else ids[p]) * v
                bid = (bid << 1) | (1 if s > 0 else 0)
            out[l] = bid
    elif family_code == WTA:
        for l in range(L):
            bid = 0
            for k in range(K):
                bid = (bid << bits) | _wta_code(int_params, l * K + k, ids, vals, dense)
            out[l] = bid
    elif family_code == DWTA:
        key = _key(int_params, KL)
        nonzero = False
        for p in range(vals.shape[0]):
            if vals[p] != 0:
                nonzero = True
                break
        for l in range(L):
            bid = 0
            for k in range(K):
                j = l * K + k
                code = 0
                if nonzero:
                    # an empty bin borrows the code of the bin a hash of (j, attempt) names
                    pos = _dwta_raw(int_params, j, ids, vals, dense)
                    attempt = 1
                    while pos < 0 and attempt <= MAX_PROBES:
                        pos = _dwta_raw(int_params, _below(_mix3(key, j, attempt), KL), ids,
                                        vals, dense)
                        attempt += 1
                    if pos >= 0:
                        code = pos
                bid = (bid << bits) | code
            out[l] = bid
    else:  # DOPH
        _doph_tables(K, L, bits, int_params, ids, vals, dense, out)


# ----------------------------------------------------------------------------- public kernels

@njit(cache=True, nogil=True)
def hash_dense_into(family_code, K, L, bits, int_params, float_params, x, out):
    """Write the L bucket ids of the dense vector ``x`` (float32[dim]) into ``out`` (int32[L]).

    Callable from other njit code (including prange bodies); allocation-free except DOPH, which
    allocates buffers of ~3 dim + K words per call."""
    if family_code == SIMHASH and int_params[0, 2] == 1:
        # the projections as a dense +-1/0 matrix: one vectorised dot product a hash
        for l in range(L):
            bid = 0
            for k in range(K):
                bid = (bid << 1) | (1 if _dot(float_params[l * K + k], x) > 0 else 0)
            out[l] = bid
    else:
        _hash_tables(family_code, K, L, bits, int_params, _NO_IDS, x, True, out)


@njit(cache=True, nogil=True)
def hash_sparse_into(family_code, K, L, bits, int_params, float_params, indices, values, out):
    """Write the L bucket ids of a sparse vector (CSR row: int32 ``indices`` sorted ascending,
    float32 ``values``) into ``out`` (int32[L]); the same ids ``hash_dense_into`` gives for the
    dense form of the vector. Allocation-free except DOPH (buffers of ~3 nnz + K words)."""
    _hash_tables(family_code, K, L, bits, int_params, indices, values, False, out)


@njit(cache=True, nogil=True, parallel=True)
def _hash_dense_batch_kernel(family_code, K, L, bits, int_params, float_params, X, out):
    for i in prange(X.shape[0]):
        hash_dense_into(family_code, K, L, bits, int_params, float_params, X[i], out[i])


@njit(cache=True, nogil=True, parallel=True)
def _hash_sparse_batch_kernel(family_code, K, L, bits, int_params, float_params,
                              indptr, indices, values, out):
    for i in prange(indptr.shape[0] - 1):
        a = indptr[i]
        b = indptr[i + 1]
        hash_sparse_into(family_code, K, L, bits, int_params, float_params,
                         indices[a:b], values[a:b], out[i])


# ----------------------------------------------------------------------------- drawing

@njit(cache=True, nogil=True)
def _simhash_matrix(keys, dim, out):
    """out[j, d] = coefficient of dimension d in projection j (from the counter hash)."""
    for j in range(keys.shape[0]):
        for d in range(dim):
            out[j, d] = _simhash_coef(keys[j], d)


def draw_hash_functions(family, dim, K, L, range_pow, seed, doph_top=DOPH_DEFAULT_TOP):
    """Draw the K*L hash functions of a family from ``seed``; validates the configuration.

    ``int_params`` layout (2-D int32):
      * simhash: ``[K*L, 3]``, row j = (key hi, key lo, mode); mode 1: ``float_params`` is the
        dense ``[K*L, dim]`` matrix of coefficients (+1/-1/0); mode 0 (more than
        ``SIMHASH_MATRIX_LIMIT`` entries): dense hashing evaluates the coefficients on the fly.
      * wta / dwta: ``[K*L + 1, 8]``, row j = the 8 dimensions of bin j; row K*L = (key hi, key lo,
        0...) for densification probing.
      * doph: ``[L + 1, 2]``, row l = (key hi, key lo) of table l; row L = (t, 0) with t the
        number of top coordinates.
    ``float_params`` is a 1x1 dummy for every other family.
    """
    code = _family_code(family)
    check_hash_config(code, K, L, range_pow)
    if int(dim) != dim or int(dim) < 1:
        raise ValueError(f"dim must be a positive integer, got {dim!r}")
    dim, K, L, range_pow = int(dim), int(K), int(L), int(range_pow)
    seed = int(seed)
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    seed &= 0xFFFFFFFFFFFFFFFF
    bits = bits_per_hash(code, K, range_pow)
    KL = K * L
    float_params = np.zeros((1, 1), dtype=np.float32)
    if code == SIMHASH:
        keys = np.array([stream_seed(seed, STREAM_SIMHASH, j) for j in range(KL)], dtype=np.uint64)
        int_params = np.zeros((KL, 3), dtype=np.int32)
        if KL * dim <= SIMHASH_MATRIX_LIMIT:
            float_params = np.empty((KL, dim), dtype=np.float32)
            _simhash_matrix(keys, dim, float_params)
            int_params[:, 2] = 1
        for j in range(KL):
            int_params[j, 0], int_params[j, 1] = _split_key(keys[j])
    elif code in (WTA, DWTA):
        if dim < BIN_SIZE:
            raise ValueError(f"{_FAMILY_NAMES[code]} needs dim >= {BIN_SIZE} (bins of "
                             f"{BIN_SIZE}), got dim={dim}")
        rng = np.random.default_rng([seed, code])
        per_perm = dim // BIN_SIZE
        n_perm = -(-KL // per_perm)
        bins = np.concatenate([rng.permutation(dim)[: per_perm * BIN_SIZE] for _ in range(n_perm)])
        int_params = np.zeros((KL + 1, BIN_SIZE), dtype=np.int32)
        int_params[:KL] = bins[: KL * BIN_SIZE].reshape(KL, BIN_SIZE)
        int_params[KL, 0], int_params[KL, 1] = _split_key(stream_seed(seed, STREAM_DWTA, code))
    else:
        if int(doph_top) != doph_top or int(doph_top) < 1:
            raise ValueError(f"doph_top must be a positive integer, got {doph_top!r}")
        int_params = np.zeros((L + 1, 2), dtype=np.int32)
        for l in range(L):
            int_params[l, 0], int_params[l, 1] = _split_key(stream_seed(seed, STREAM_DOPH, l))
        int_params[L, 0] = int(doph_top)
    return HashFunctions(code, dim, K, L, range_pow, bits, seed, int_params, float_params)


def _check_hf(hf):
    if not isinstance(hf, HashFunctions):
        raise ValueError(f"expected a HashFunctions tuple, got {type(hf).__name__}")


def hash_dense_batch(hf, X):
    """Bucket ids of every row of a dense float32 matrix ``X[n, dim]`` -> int32[n, L] (parallel)."""
    _check_hf(hf)
    X = np.asarray(X)
    if X.ndim == 1:
        X = X[None, :]
    if X.ndim != 2 or X.shape[1] != hf.dim:
        raise ValueError(f"X must have shape (n, {hf.dim}), got {X.shape}")
    X = np.ascontiguousarray(X, dtype=np.float32)
    if not np.all(np.isfinite(X)):
        raise ValueError("X contains non-finite values")
    out = np.empty((X.shape[0], hf.L), dtype=np.int32)
    _hash_dense_batch_kernel(hf.family_code, hf.K, hf.L, hf.bits, hf.int_params, hf.float_params,
                             X, out)
    return out


def as_csr_arrays(X, dim):
    """``(indptr int64, indices int32 sorted per row, data float32)`` of a scipy sparse ``X`` with
    ``dim`` columns; duplicates summed. Raises ValueError on anything else."""
    if not sp.issparse(X):
        raise ValueError(f"expected a scipy.sparse matrix, got {type(X).__name__}")
    X = sp.csr_matrix(X, copy=True)
    if X.shape[1] != dim:
        raise ValueError(f"sparse input must have {dim} columns, got {X.shape[1]}")
    X.sum_duplicates()  # also sorts the indices, which the kernels' binary searches rely on
    data = np.ascontiguousarray(X.data, dtype=np.float32)
    if not np.all(np.isfinite(data)):
        raise ValueError("sparse input contains non-finite values")
    return (np.ascontiguousarray(X.indptr, dtype=np.int64),
            np.ascontiguousarray(X.indices, dtype=np.int32), data)


def hash_sparse_batch(hf, csr):
    """Bucket ids of every row of a scipy CSR matrix with ``hf.dim`` columns -> int32[n, L]."""
    _check_hf(hf)
    indptr, indices, data = as_csr_arrays(csr, hf.dim)
    out = np.empty((indptr.shape[0] - 1, hf.L), dtype=np.int32)
    _hash_sparse_batch_kernel(hf.family_code, hf.K, hf.L, hf.bits, hf.int_params, hf.float_params,
                              indptr, indices, data, out)
    return out
