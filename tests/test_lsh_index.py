"""CSR hash tables: counting-sort build vs a NumPy reference, bucket policies, rehash/rebuild,
determinism, persistence, memory."""
import numpy as np
import pytest
from scipy import stats

from slide.kernels.lsh import LSHIndex, build_tables_into, insertion_order
from slide.kernels.lsh.index import FIFO, RESERVOIR


def run_build(codes, bucket_size, policy, seed, range_pow):
    N, L = codes.shape
    offsets = np.empty((L, 2**range_pow + 1), np.int32)
    items = np.empty((L, N), np.int32)
    build_tables_into(np.ascontiguousarray(codes, np.int32), bucket_size, policy, np.uint64(seed),
                      offsets, items)
    return offsets, items


def test_fifo_tables_match_numpy_reference_and_keep_the_last_inserted():
    rng = np.random.default_rng(0)
    N, L, R, cap = 500, 6, 5, 7  # 32 buckets, ~16 neurons each: many overflow
    codes = rng.integers(0, 2**R, size=(N, L)).astype(np.int32)
    codes[:, 0] = 3  # table 0: everything in one bucket
    offsets, items = run_build(codes, cap, FIFO, 42, R)
    overflowing = 0
    for l in range(L):
        order = insertion_order(N, 42, l)
        assert sorted(order) == list(range(N))
        for b in range(2**R):
            arrivals = [i for i in order if codes[i, l] == b]  # in insertion order
            expect = arrivals[-cap:]  # FIFO: the most recently inserted survive, oldest first
            got = items[l, offsets[l, b]:offsets[l, b + 1]]
            assert list(got) == expect
            overflowing += len(arrivals) > cap
        total = offsets[l, -1]
        assert (items[l, total:] == -1).all()
    print(f"fifo reference check: {overflowing} overflowing buckets of {L * 2**R}")
    assert overflowing > 50
    # the insertion order is a real shuffle, so the survivors of the one big bucket are not an id range
    kept = np.sort(items[0, :cap])
    assert kept.max() - kept.min() > N // 2


def test_reservoir_keeps_a_uniform_sample():
    """All 40 neurons in one bucket of capacity 10, in 3000 tables (independent streams):
    every neuron should survive in 3000 * 10/40 = 750 tables; chi-square against uniform."""
    N, L, cap = 40, 3000, 10
    codes = np.zeros((N, L), np.int32)
    offsets, items = run_build(codes, cap, RESERVOIR, 7, 1)
    assert (offsets[:, 1] == cap).all() and (offsets[:, 2] == cap).all()
    kept = items[:, :cap]
    assert all(len(set(row)) == cap for row in kept)
    freq = np.bincount(kept.ravel(), minlength=N)
    chi2, p = stats.chisquare(freq)
    print(f"reservoir survival counts: min {freq.min()} max {freq.max()} (expect 750), chi2 {chi2:.1f}, p {p:.3f}")
    assert p > 0.001
    # and the pairs are not frozen: the sample differs between tables
    assert len({tuple(sorted(r)) for r in kept[:50]}) == 50
    # a biased policy (keeping the first 10 inserted ids) fails the same test
    biased = np.bincount(np.arange(L * cap) % cap, minlength=N)
    assert stats.chisquare(biased)[1] < 1e-6


def test_reservoir_without_overflow_keeps_everyone():
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 64, size=(300, 4)).astype(np.int32)
    offsets, items = run_build(codes, 300, RESERVOIR, 3, 6)
    for l in range(4):
        for b in range(64):
            got = np.sort(items[l, offsets[l, b]:offsets[l, b + 1]])
            np.testing.assert_array_equal(got, np.flatnonzero(codes[:, l] == b))


@pytest.mark.parametrize("policy", ["fifo", "reservoir"])
def test_bucket_capacity_is_respected(policy):
    rng = np.random.default_rng(2)
    W = rng.standard_normal((3000, 32)).astype(np.float32)
    idx = LSHIndex("simhash", 32, 4, 10, 4, bucket_size=20, policy=policy, seed=1).build(W)
    sizes = np.diff(idx.offsets, axis=1)
    assert sizes.max() == 20  # 3000 neurons in 16 buckets: the cap binds
    # each table holds min(count, cap) of every bucket, all distinct, all in range
    from slide.kernels.lsh import hash_dense_batch
    codes = hash_dense_batch(idx.hf, W)
    for l in range(idx.L):
        counts = np.bincount(codes[:, l], minlength=16)
        np.testing.assert_array_equal(sizes[l], np.minimum(counts, 20))
        used = idx.items[l, :idx.offsets[l, -1]]
        assert len(np.unique(used)) == used.size and used.min() >= 0 and used.max() < 3000
        for b in range(16):
            assert (codes[idx.bucket(l, b), l] == b).all()


@pytest.mark.parametrize("family,K", [("simhash", 8), ("wta", 3), ("dwta", 3), ("doph", 3)])
def test_rehash_and_rebuild_keep_every_neuron_findable(family, K):
    rng = np.random.default_rng(3)
    N, dim, L = 400, 48, 6
    W = rng.standard_normal((N, dim)).astype(np.float32)
    if family == "dwta":
        W[rng.random(W.shape) < 0.5] = 0
    idx = LSHIndex(family, dim, K, L, 10, bucket_size=N, seed=5).build(W)

    def all_findable(M):
        from slide.kernels.lsh import hash_dense_batch
        codes = hash_dense_batch(idx.hf, M)
        for l in range(L):
            for i in range(N):
                if i not in idx.bucket(l, codes[i, l]):
                    return False
        return True

    assert all_findable(W)
    W2 = W + 0.5 * rng.standard_normal(W.shape).astype(np.float32)
    before = idx.hf.int_params.copy()
    idx.rehash(W2)
    np.testing.assert_array_equal(idx.hf.int_params, before)  # same functions
    assert all_findable(W2)
    old_seed = idx.seed
    idx.rebuild(W2)
    assert idx.seed != old_seed
    assert not np.array_equal(idx.hf.int_params, before)  # new keys / bins
    assert all_findable(W2)
    # the derived seed is deterministic
    other = LSHIndex(family, dim, K, L, 10, bucket_size=N, seed=5).build(W).rebuild(W2)
    assert other.seed == idx.seed
    idx.rebuild(W, seed=123)
    assert idx.seed == 123 and all_findable(W)


def test_same_seed_same_tables_different_seed_different_tables():
    rng = np.random.default_rng(4)
    W = rng.standard_normal((2000, 32)).astype(np.float32)
    for policy in ("fifo", "reservoir"):
        a = LSHIndex("dwta", 32, 2, 8, 6, bucket_size=16, policy=policy, seed=9).build(W)
        b = LSHIndex("dwta", 32, 2, 8, 6, bucket_size=16, policy=policy, seed=9).build(W)
        c = LSHIndex("dwta", 32, 2, 8, 6, bucket_size=16, policy=policy, seed=10).build(W)
        np.testing.assert_array_equal(a.offsets, b.offsets)
        np.testing.assert_array_equal(a.items, b.items)
        assert not np.array_equal(a.items, c.items)
        # a rehash with unchanged weights draws new insertion orders (generation 1): the same
        # buckets are full, but other neurons survive the cap
        items0 = a.items.copy()
        a.rehash(W)
        np.testing.assert_array_equal(a.offsets, b.offsets)
        assert not np.array_equal(a.items, items0)


def test_state_dict_roundtrip_and_validation():
    rng = np.random.default_rng(5)
    W = rng.standard_normal((500, 24)).astype(np.float32)
    idx = LSHIndex("doph", 24, 2, 5, 8, bucket_size=8, policy="reservoir", seed=3, doph_top=6).build(W)
    idx.rehash(W * 1.1)
    d = idx.state_dict()
    assert all(isinstance(v, (int, np.ndarray)) for v in d.values())
    new = LSHIndex.from_state(d)
    np.testing.assert_array_equal(new.offsets, idx.offsets)
    np.testing.assert_array_equal(new.items, idx.items)
    assert new.generation == idx.generation and new.doph_top == 6 and new.policy == "reservoir"
    for x in W[:20]:
        np.testing.assert_array_equal(new.query(x), idx.query(x))
        np.testing.assert_array_equal(new.candidates(x), idx.candidates(x))
    # the next rehash also agrees (the generation counter travelled)
    new.rehash(W)
    idx.rehash(W)
    np.testing.assert_array_equal(new.items, idx.items)
    bad = dict(d, int_params=d["int_params"] + 1)
    with pytest.raises(ValueError, match="int_params"):
        LSHIndex.from_state(bad)
    bad = dict(d, items=np.full_like(d["items"], 10**6))
    with pytest.raises(ValueError, match="out of range"):
        LSHIndex.from_state(bad)
    bad = {k: v for k, v in d.items() if k != "offsets"}
    with pytest.raises(ValueError, match="no tables"):
        LSHIndex.from_state(bad)
    with pytest.raises(ValueError, match="lacks"):
        LSHIndex.from_state({"format": 1})


def test_memory_is_linear_in_neurons_plus_buckets():
    def table_bytes(N, L, range_pow):         # int32 offsets [L, 2**rp + 1] + items [L, N]
        return L * (2**range_pow + 1) * 4 + L * N * 4

    rng = np.random.default_rng(6)
    for N, L, rp in ((1000, 7, 9), (3000, 3, 12), (200, 11, 6)):
        W = rng.standard_normal((N, 16)).astype(np.float32)
        idx = LSHIndex("wta", 16, 2, L, rp, seed=0).build(W)
        params = idx.hf.int_params.nbytes + idx.hf.float_params.nbytes
        assert idx.memory_bytes() == table_bytes(N, L, rp) + params
        assert idx.offsets.nbytes + idx.items.nbytes == table_bytes(N, L, rp)
    # Amazon-670K shape, by the formula the real indices above obey: ~0.19 GB
    est = table_bytes(670_091, 50, 18)
    print(f"index tables at N=670091, L=50, range_pow=18: {est / 1e9:.3f} GB")
    assert est < 0.2e9


def test_index_validation():
    idx = LSHIndex("simhash", 16, 4, 3, 6)
    with pytest.raises(ValueError, match="build"):
        idx.candidates(np.zeros(16, np.float32))
    with pytest.raises(ValueError, match=r"shape \(n_neurons, 16\)"):
        idx.build(np.zeros((5, 15), np.float32))
    with pytest.raises(ValueError, match="unknown bucket policy"):
        LSHIndex("simhash", 16, 4, 3, 6, policy="lru")
    with pytest.raises(ValueError, match="bucket_size"):
        LSHIndex("simhash", 16, 4, 3, 6, bucket_size=0)
    with pytest.raises(ValueError, match="K=3 DWTA hashes need 9 bits but range_pow=6"):
        LSHIndex("dwta", 16, 3, 3, 6)
    idx.build(np.ones((5, 16), np.float32))
    with pytest.raises(ValueError, match="length 16"):
        idx.query(np.zeros(17, np.float32))
