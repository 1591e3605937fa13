"""Hash families: kernels vs slow pure-Python references, dense == sparse, collision behaviour,
configuration errors."""
import numpy as np
import pytest
import scipy.sparse as sp

from slide.kernels.lsh import hashes as H
from slide.kernels.lsh.hashes import (FAMILIES, bits_per_hash, check_hash_config, draw_hash_functions,
                              hash_dense_batch, hash_dense_into, hash_sparse_batch, hash_sparse_into)

M64 = (1 << 64) - 1
GOLDEN, MIX1, MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


# ----------------------------------------------------------------------------- slow references

def py_splitmix(state):
    state = (state + GOLDEN) & M64
    z = state
    z = ((z ^ (z >> 30)) * MIX1) & M64
    z = ((z ^ (z >> 27)) * MIX2) & M64
    return state, z ^ (z >> 31)


def py_mix3(key, a, b):
    return py_splitmix(key ^ ((a * MIX1) & M64) ^ ((b * MIX2) & M64))[1]


def py_below(z, n):
    return ((z >> 32) * n) >> 32


def py_key(int_params, row):
    return (int(np.uint32(int_params[row, 0])) << 32) | int(np.uint32(int_params[row, 1]))


def pack(codes, K, L, bits):
    out = np.zeros(L, dtype=np.int64)
    for l in range(L):
        for k in range(K):
            out[l] = (out[l] << bits) | int(codes[l * K + k])
    return out


def ref_simhash(hf, x):
    KL = hf.K * hf.L
    codes = []
    for j in range(KL):
        key = py_key(hf.int_params, j)
        a = np.array([[1.0, -1.0, 0.0, 0.0, 0.0, 0.0][py_below(py_mix3(key, d, 0), 6)] for d in range(hf.dim)])
        codes.append(1 if float(a @ x.astype(np.float64)) > 0 else 0)
    return pack(codes, hf.K, hf.L, 1)


def ref_wta(hf, x):
    KL = hf.K * hf.L
    bins = hf.int_params[:KL]
    return pack([int(np.argmax(x[bins[j]])) for j in range(KL)], hf.K, hf.L, 3)


def ref_dwta(hf, x):
    KL = hf.K * hf.L
    bins = hf.int_params[:KL]
    key = py_key(hf.int_params, KL)

    def raw(j):
        v = x[bins[j]]
        nz = np.flatnonzero(v != 0)
        if nz.size == 0:
            return -1
        return int(nz[np.argmax(v[nz])])

    codes = []
    for j in range(KL):
        c = -1
        if np.any(x != 0):
            c = raw(j)
            attempt = 1
            while c < 0 and attempt <= 100:
                c = raw(py_below(py_mix3(key, j, attempt), KL))
                attempt += 1
        codes.append(max(c, 0))
    return pack(codes, hf.K, hf.L, 3)


def ref_doph(hf, x):
    K, L, bits = hf.K, hf.L, hf.bits
    t = int(hf.int_params[L, 0])
    pos = np.sort(x[x > 0])[::-1]
    codes = []
    if pos.size == 0:
        return pack([0] * (K * L), K, L, bits)
    thr = pos[min(t, pos.size) - 1]
    S = np.flatnonzero((x > 0) & (x >= thr))
    for l in range(L):
        key = py_key(hf.int_params, l)
        u = {int(i): py_mix3(key, int(i), 1) for i in S}

        def bin_min(k):
            vals = [v for v in u.values() if py_below(v, K) == k]
            return min(vals) if vals else None

        for k in range(K):
            m = bin_min(k)
            attempt = 1
            while m is None and attempt <= 100:
                m = bin_min(py_below(py_mix3(key, k, attempt + 1), K))
                attempt += 1
            codes.append(0 if m is None else m & ((1 << bits) - 1))
    return pack(codes, K, L, bits)


REFS = {"simhash": ref_simhash, "wta": ref_wta, "dwta": ref_dwta, "doph": ref_doph}
CONFIGS = {"simhash": (8, 6, 10), "wta": (3, 5, 10), "dwta": (3, 5, 10), "doph": (2, 5, 10)}


def random_vectors(rng, n, dim, density):
    X = rng.standard_normal((n, dim)).astype(np.float32)
    X[rng.random((n, dim)) > density] = 0
    X[0] = 0  # the zero vector is a corner case for every family
    X[1, :] = 0
    X[1, 3] = 1.5  # a single nonzero
    return X


# ----------------------------------------------------------------------------- kernel vs reference

@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_dense_and_sparse_kernels_match_reference(family):
    rng = np.random.default_rng(FAMILIES[family])
    K, L, R = CONFIGS[family]
    dim = 40
    hf = draw_hash_functions(family, dim, K, L, R, seed=11, doph_top=6)
    X = random_vectors(rng, 14, dim, density=0.3)
    X[2] = np.abs(X[2])
    X[3] = (rng.random(dim) < 0.2).astype(np.float32)  # a binary vector: ties everywhere
    ref = np.array([REFS[family](hf, x) for x in X])
    dense = np.empty((len(X), L), dtype=np.int32)
    sparse = np.empty((len(X), L), dtype=np.int32)
    for i, x in enumerate(X):
        hash_dense_into(hf.family_code, K, L, hf.bits, hf.int_params, hf.float_params, x, dense[i])
        nz = np.flatnonzero(x).astype(np.int32)
        hash_sparse_into(hf.family_code, K, L, hf.bits, hf.int_params, hf.float_params, nz,
                         x[nz].astype(np.float32), sparse[i])
    np.testing.assert_array_equal(dense, ref)
    np.testing.assert_array_equal(sparse, ref)
    np.testing.assert_array_equal(hash_dense_batch(hf, X), ref)
    np.testing.assert_array_equal(hash_sparse_batch(hf, sp.csr_matrix(X)), ref)
    assert ref.min() >= 0 and ref.max() < 2 ** (K * hf.bits) <= 2 ** R


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_sparse_equals_dense_on_realistic_inputs(family):
    """A weight row hashed densely and the same vector hashed as a CSR row land in the same
    buckets (unsorted/duplicate CSR input is canonicalised by the wrapper)."""
    rng = np.random.default_rng(7)
    K, L, R = {"simhash": (10, 20, 12), "wta": (4, 20, 12), "dwta": (4, 20, 12), "doph": (3, 20, 12)}[family]
    hf = draw_hash_functions(family, 300, K, L, R, seed=5)
    X = random_vectors(rng, 60, 300, density=0.1)
    if family in ("dwta", "doph"):
        X = np.maximum(X, 0)
    a = hash_dense_batch(hf, X)
    b = hash_sparse_batch(hf, sp.csr_matrix(X))
    # the same rows with shuffled column order and a split duplicate entry
    C = sp.coo_matrix(X)
    perm = rng.permutation(C.nnz)
    rows, cols, vals = C.row[perm], C.col[perm], C.data[perm]
    rows = np.r_[rows, rows[:1]]
    cols = np.r_[cols, cols[:1]]
    vals = np.r_[vals * 1, np.float32(0)]  # a duplicate entry adding 0 keeps the vector unchanged
    c = hash_sparse_batch(hf, sp.csr_matrix((vals, (rows, cols)), shape=X.shape))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)


def test_simhash_without_matrix_matches_matrix_mode(monkeypatch):
    """Above SIMHASH_MATRIX_LIMIT the dense path evaluates coefficients on the fly; same codes."""
    rng = np.random.default_rng(3)
    X = random_vectors(rng, 20, 50, density=0.5)
    hf = draw_hash_functions("simhash", 50, 6, 8, 10, seed=2)
    monkeypatch.setattr(H, "SIMHASH_MATRIX_LIMIT", 10)
    hf2 = draw_hash_functions("simhash", 50, 6, 8, 10, seed=2)
    assert hf.float_params.shape == (48, 50) and hf2.float_params.shape == (1, 1)
    np.testing.assert_array_equal(hash_dense_batch(hf, X), hash_dense_batch(hf2, X))


def test_simhash_projection_reads_a_third_of_the_dimensions():
    hf = draw_hash_functions("simhash", 3000, 10, 10, 12, seed=0)
    P = hf.float_params
    assert set(np.unique(P)) == {-1.0, 0.0, 1.0}
    frac = (P != 0).mean(axis=1)
    print(f"simhash nonzero fraction per projection: mean {frac.mean():.4f} min {frac.min():.4f} max {frac.max():.4f}")
    assert abs(frac.mean() - 1 / 3) < 0.005 and frac.min() > 0.3 and frac.max() < 0.37
    assert abs((P > 0).mean() - (P < 0).mean()) < 0.01


# ----------------------------------------------------------------------------- collision behaviour

def collision_rate(hf, pairs, sparse=False):
    xs = np.array([p[0] for p in pairs])
    ys = np.array([p[1] for p in pairs])
    if sparse:
        a, b = hash_sparse_batch(hf, sp.csr_matrix(xs)), hash_sparse_batch(hf, sp.csr_matrix(ys))
    else:
        a, b = hash_dense_batch(hf, xs), hash_dense_batch(hf, ys)
    return float((a == b).mean())


def test_simhash_collision_probability_is_one_minus_theta_over_pi():
    rng = np.random.default_rng(0)
    dim, L = 256, 3000
    hf = draw_hash_functions("simhash", dim, 1, L, 1, seed=4)
    for theta in (np.pi / 8, np.pi / 4, np.pi / 2, 3 * np.pi / 4):
        pairs = []
        for _ in range(4):
            x = rng.standard_normal(dim)
            x /= np.linalg.norm(x)
            z = rng.standard_normal(dim)
            z -= (z @ x) * x
            z /= np.linalg.norm(z)
            y = np.cos(theta) * x + np.sin(theta) * z
            pairs.append((x.astype(np.float32), y.astype(np.float32)))
        p = collision_rate(hf, pairs)
        expect = 1 - theta / np.pi
        sd = np.sqrt(expect * (1 - expect) / (4 * L))
        print(f"simhash theta={theta:.3f}: collision {p:.4f}, 1-theta/pi {expect:.4f}, sd {sd:.4f}")
        # the sparse projections see a random third of the coordinates, whose angle scatters
        # around theta: allow 5 sd of sampling error plus 0.02 for that
        assert abs(p - expect) < 5 * sd + 0.02


def correlated_pairs(rng, dim, rho, n, relu):
    pairs = []
    for _ in range(n):
        x = rng.standard_normal(dim)
        y = rho * x + np.sqrt(1 - rho**2) * rng.standard_normal(dim)
        if relu:
            x, y = np.maximum(x, 0), np.maximum(y, 0)
        pairs.append((x.astype(np.float32), y.astype(np.float32)))
    return pairs


@pytest.mark.parametrize("family", ["wta", "dwta"])
def test_wta_dwta_collision_rises_with_similarity(family):
    rng = np.random.default_rng(1)
    dim, L = 128, 1000
    hf = draw_hash_functions(family, dim, 1, L, 3, seed=9)
    rhos = (0.0, 0.5, 0.8, 0.95, 1.0)
    # 16 pairs: the 1000 bins reuse the same 128 dimensions, so one pair's rate scatters (sd ~0.04)
    rates = [collision_rate(hf, correlated_pairs(rng, dim, r, 16, relu=family == "dwta")) for r in rhos]
    print(f"{family} collision by correlation {dict(zip(rhos, np.round(rates, 4)))}")
    assert all(b > a + 0.05 for a, b in zip(rates, rates[1:]))
    assert rates[-1] == 1.0
    if family == "wta":
        assert abs(rates[0] - 1 / 8) < 0.04  # independent inputs: a uniform code of 8
    else:
        # ReLU inputs: empty bins borrow from the same neighbours, so independent inputs collide
        # somewhat more often than 1/8, but far less than correlated ones
        assert rates[0] < 0.3


def test_dwta_on_sparse_inputs_densifies_and_tracks_overlap():
    """Very sparse ReLU-like inputs (most bins empty): codes come from densification, and the
    collision rate still rises with the overlap of the supports."""
    rng = np.random.default_rng(2)
    dim, L, nnz = 2000, 600, 40
    hf = draw_hash_functions("dwta", dim, 1, L, 3, seed=3)
    rates = []
    for shared in (0, 10, 25, 40):
        pairs = []
        for _ in range(4):
            idx = rng.choice(dim, 2 * nnz, replace=False)
            x = np.zeros(dim, np.float32)
            y = np.zeros(dim, np.float32)
            vals = rng.random(nnz).astype(np.float32) + 0.1
            x[idx[:nnz]] = vals
            y[idx[:shared]] = vals[:shared]
            y[idx[nnz:2 * nnz - shared]] = rng.random(nnz - shared).astype(np.float32) + 0.1
            pairs.append((x, y))
        rates.append(collision_rate(hf, pairs, sparse=True))
    print(f"dwta sparse collision by shared support (of {nnz}): {np.round(rates, 4)}")
    assert all(b > a + 0.05 for a, b in zip(rates, rates[1:]))
    assert rates[-1] == 1.0


def test_doph_collision_follows_jaccard():
    """b-bit minhash: P(collision) = J + (1 - J) / 2**bits for sets of Jaccard similarity J."""
    rng = np.random.default_rng(3)
    dim, L, size = 5000, 800, 60
    hf = draw_hash_functions("doph", dim, 2, L, 12, seed=1)  # bits = 6
    rates, expects = [], []
    for shared in (0, 20, 40, 55, 60):
        pairs = []
        for _ in range(4):
            idx = rng.choice(dim, 2 * size, replace=False)
            x = np.zeros(dim, np.float32)
            y = np.zeros(dim, np.float32)
            x[idx[:size]] = 1
            y[idx[:shared]] = 1
            y[idx[size:2 * size - shared]] = 1
            pairs.append((x, y))
        a = hash_sparse_batch(hf, sp.csr_matrix(np.array([p[0] for p in pairs])))
        b = hash_sparse_batch(hf, sp.csr_matrix(np.array([p[1] for p in pairs])))
        # per-code collision: split each bucket id into its K = 2 codes of 6 bits
        codes_equal = np.concatenate([((a >> s) & 63) == ((b >> s) & 63) for s in (0, 6)])
        J = shared / (2 * size - shared)
        rates.append(codes_equal.mean())
        expects.append(J + (1 - J) / 64)
    print(f"doph per-code collision {np.round(rates, 4)} vs J + (1-J)/2^bits {np.round(expects, 4)}")
    assert all(b > a for a, b in zip(rates, rates[1:]))
    for r, e in zip(rates, expects):
        assert abs(r - e) < 0.04


def test_doph_uses_the_top_coordinates():
    """Two vectors whose top-t coordinates coincide hash identically even if the small entries
    differ; moving a top coordinate changes codes."""
    rng = np.random.default_rng(4)
    dim = 200
    hf = draw_hash_functions("doph", dim, 3, 30, 12, seed=2, doph_top=5)
    x = rng.random(dim).astype(np.float32) * 0.1
    top = rng.choice(dim, 5, replace=False)
    x[top] = np.arange(5, 10)
    y = x.copy()
    y[np.setdiff1d(np.arange(dim), top)] = rng.random(dim - 5).astype(np.float32) * 0.1
    z = x.copy()
    z[top[0]] = 0.0
    hx, hy, hz = hash_dense_batch(hf, np.array([x, y, z]))
    np.testing.assert_array_equal(hx, hy)
    assert (hx != hz).sum() >= 5


def test_dwta_packs_full_three_bits():
    """With K = 2 every one of the 64 (code, code) pairs occurs: a 2-bit shift would merge them."""
    rng = np.random.default_rng(5)
    hf = draw_hash_functions("dwta", 64, 2, 4, 6, seed=0)
    ids = hash_dense_batch(hf, rng.standard_normal((2000, 64)).astype(np.float32))
    assert set(np.unique(ids)) == set(range(64))


# ----------------------------------------------------------------------------- configuration

def test_bits_and_config_errors():
    assert [bits_per_hash(f, 6, 18) for f in ("simhash", "wta", "dwta", "doph")] == [1, 3, 3, 3]
    check_hash_config("dwta", 6, 50, 18)
    with pytest.raises(ValueError, match=r"K=7 DWTA hashes need 21 bits but range_pow=18"):
        check_hash_config("dwta", 7, 50, 18)
    with pytest.raises(ValueError, match=r"K=19 SIMHASH hashes need 19 bits but range_pow=18"):
        draw_hash_functions("simhash", 128, 19, 5, 18, seed=0)
    with pytest.raises(ValueError, match=r"K=20 DOPH"):
        check_hash_config("doph", 20, 5, 18)
    with pytest.raises(ValueError, match="unknown hash family"):
        check_hash_config("minhash", 2, 5, 18)
    with pytest.raises(ValueError, match="L must be a positive integer"):
        check_hash_config("wta", 2, 0, 18)
    with pytest.raises(ValueError, match="range_pow=31 is too large"):
        check_hash_config("simhash", 2, 3, 31)
    with pytest.raises(ValueError, match="dim >= 8"):
        draw_hash_functions("wta", 5, 2, 3, 10, seed=0)


def test_same_seed_same_functions_and_input_validation():
    for fam in FAMILIES:
        a = draw_hash_functions(fam, 64, 2, 4, 10, seed=3)
        b = draw_hash_functions(fam, 64, 2, 4, 10, seed=3)
        c = draw_hash_functions(fam, 64, 2, 4, 10, seed=4)
        assert np.array_equal(a.int_params, b.int_params) and np.array_equal(a.float_params, b.float_params)
        assert not (np.array_equal(a.int_params, c.int_params) and np.array_equal(a.float_params, c.float_params))
        assert a.int_params.dtype == np.int32 and a.int_params.ndim == 2
        assert a.float_params.dtype == np.float32 and a.float_params.ndim == 2
    hf = draw_hash_functions("wta", 64, 2, 4, 10, seed=3)
    with pytest.raises(ValueError, match=r"shape \(n, 64\)"):
        hash_dense_batch(hf, np.zeros((3, 63), np.float32))
    with pytest.raises(ValueError, match="non-finite"):
        hash_dense_batch(hf, np.full((2, 64), np.nan, np.float32))
    with pytest.raises(ValueError, match="64 columns"):
        hash_sparse_batch(hf, sp.csr_matrix((2, 65), dtype=np.float32))
