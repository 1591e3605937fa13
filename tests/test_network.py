"""Batch kernel bookkeeping, sparse optimizer, rehash schedule, exact/sparse inference."""
import math

import numpy as np
import pytest
import scipy.sparse as sp

from slide.kernels.lsh.hashes import hash_dense_batch
from slide.network import Network
from slide.network.diagnostics import first_layer_gradient
from slide.network.schedule import RehashSchedule
from slide.network.optim import SparseOptimizer, adam_lr


def _data(rng, n, n_features, n_labels, nnz=5, ny=2):
    rows, cols, vals, yr, yc = [], [], [], [], []
    for i in range(n):
        f = rng.choice(n_features, nnz, replace=False)
        rows += [i] * nnz
        cols += list(f)
        vals += list(rng.uniform(0.1, 1, nnz))
        lab = rng.choice(n_labels, ny, replace=False)
        yr += [i] * ny
        yc += list(lab)
    X = sp.csr_matrix((np.float32(vals), (rows, cols)), shape=(n, n_features))
    Y = sp.csr_matrix((np.ones(len(yc), np.float32), (yr, yc)), shape=(n, n_labels))
    for M in (X, Y):
        M.sort_indices()
        M.indices = M.indices.astype(np.int32)
        M.indptr = M.indptr.astype(np.int64)
    return X, Y


LSH = dict(sampler="vanilla", family="dwta", K=2, L=6, range_pow=6, bucket_size=16,
           policy="fifo", budget=12, threshold=1)


def test_sparse_adam_touches_only_active_rows():
    rng = np.random.default_rng(0)
    X, Y = _data(rng, 16, 60, 400)
    net = Network((60, 8, 400), [False, True], [0, 20], seed=1, lsh=LSH)
    net.build_indices()
    net.prepare(16, 2, 2)
    opt = SparseOptimizer("adam", net.layout, 1e-2)
    W0 = net.W.copy()
    B0 = net.B.copy()
    rows = np.arange(16, dtype=np.int64)
    net.forward_backward(X, Y, rows, 1, 1)
    lay = net.layout
    # the batch gradient: buffered layers from GW/GB, the sampled output layer from the
    # stored per-sample deltas and inputs (what slide.network.row_steps.batch_row_steps sums)
    G = np.zeros(lay.n_weights, np.float32)
    GB = np.zeros(lay.n_biases, np.float32)
    G[:net.GW.size] = net.GW
    GB[:net.GB.size] = net.GB
    if net.fused_first:
        # the batched engine's first layer: formed in the update from the per-sample deltas
        lay.weight_view(G, 0)[:] += first_layer_gradient(net, X, rows)
    G1 = lay.weight_view(G, 1)
    GB1 = lay.bias_view(GB, 1)
    active = set()
    a = int(net.sc.s_off[1])
    for s in range(16):
        for k in range(net.sc.n_act[s, 1]):
            j = net.sc.ids[s, a + k]
            active.add(int(j))
            G1[j] += net.store.d_store[s, k] * net.store.h_store[s]
            GB1[j] += net.store.d_store[s, k]
    # moments as after earlier steps (no step record: nothing to catch up), so the update
    # depends on the gradient's magnitude and not only on its sign as a first step would
    mom_rng = np.random.default_rng(10)
    M0 = (mom_rng.standard_normal(lay.n_weights) * 1e-2).astype(np.float32)
    V0 = (mom_rng.random(lay.n_weights) * 1e-3).astype(np.float32)
    MB0 = (mom_rng.standard_normal(lay.n_biases) * 1e-2).astype(np.float32)
    VB0 = (mom_rng.random(lay.n_biases) * 1e-3).astype(np.float32)
    opt.MW[:], opt.VW[:], opt.MB[:], opt.VB[:] = M0, V0, MB0, VB0
    opt.t = 3
    net.update(X, rows, 1, opt)
    nr = int(np.count_nonzero(net.touched_rows.lens[:lay.n_rows.sum()]))
    assert set(Y.indices.tolist()) <= active
    changed = np.flatnonzero((lay.weight_view(net.W, 1) != lay.weight_view(W0, 1)).any(1))
    assert set(changed.tolist()) <= active and len(changed) > 0.8 * len(active)
    untouched = np.setdiff1d(np.arange(400), list(active))
    assert len(untouched) > 100
    assert np.array_equal(lay.weight_view(opt.MW, 1)[untouched],
                          lay.weight_view(M0, 1)[untouched])
    assert np.array_equal(lay.weight_view(net.W, 1)[untouched],
                          lay.weight_view(W0, 1)[untouched])
    # first layer: only the batch's input features move
    feats = np.unique(X.indices)
    other = np.setdiff1d(np.arange(60), feats)
    assert np.array_equal(lay.weight_view(net.W, 0)[other], lay.weight_view(W0, 0)[other])
    # gradient buffers are all-zero again after the step
    assert not net.GW.any() and not net.GB.any()
    # the touched rows took one bias-corrected Adam step (step 4) from those moments
    lr4 = adam_lr(1e-2, 0.9, 0.999, 4)
    m = 0.9 * M0 + 0.1 * G
    v = 0.999 * V0 + 0.001 * G * G
    expect = W0 - lr4 * m / (np.sqrt(v) + 1e-8)
    sel = np.zeros(lay.n_weights, bool)
    for j in active:                         # output layer: the active rows
        sel[lay.w_off[1] + j * 8:lay.w_off[1] + (j + 1) * 8] = True
    for f in feats:                          # layer 0: the batch's feature rows
        sel[lay.w_off[0] + f * 8:lay.w_off[0] + (f + 1) * 8] = True
    # the batch's feature rows: in the touched list, or (batched engine) the fused step's
    assert nr == (0 if net.fused_first else len(feats))
    np.testing.assert_allclose(net.W[sel], expect[sel], rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(opt.MW[sel], m[sel], rtol=1e-4, atol=1e-9)
    mb = 0.9 * MB0 + 0.1 * GB
    vb = 0.999 * VB0 + 0.001 * GB * GB
    bsel = np.zeros(lay.n_biases, bool)
    bsel[:8] = True
    bsel[8 + np.array(sorted(active))] = True
    np.testing.assert_allclose(net.B[bsel], (B0 - lr4 * mb / (np.sqrt(vb) + 1e-8))[bsel],
                               rtol=1e-4, atol=1e-7)
    # the gradient's magnitude matters here: a sign-only step would be far off
    assert np.abs(expect[sel] - (W0 - lr4 * np.sign(G))[sel]).max() > 1e-3


def test_touched_rows_are_unique():
    rng = np.random.default_rng(1)
    X, Y = _data(rng, 32, 20, 50, nnz=8)     # heavy overlap of features and labels
    net = Network((20, 4, 3, 50), [False, False, True], [0, 0, 10], seed=1)
    net.prepare(32, 2, 2)
    rows = np.arange(32, dtype=np.int64)
    for serial in (1, 2):
        net.forward_backward(X, Y, rows, 1, serial)
        nr, nb = net.touched(X, rows, serial)
        starts = net.touched_rows.starts[:nr]
        assert len(np.unique(starts)) == nr
        assert len(np.unique(net.touched_rows.bias_ids[:nb])) == nb
        # every hidden-layer row (dense layer 1) is listed, plus the features in the batch
        # (those by the fused first-layer step instead, in the batched engine)
        assert nr == (0 if net.fused_first else len(np.unique(X.indices))) + 3
        net.GW[:] = 0
        net.GB[:] = 0


def test_sgd_step():
    rng = np.random.default_rng(2)
    X, Y = _data(rng, 8, 30, 40)
    net = Network((30, 5, 40), [False, False], [0, 0], seed=2)
    net.prepare(8, 1, 2)
    opt = SparseOptimizer("sgd", net.layout, 0.5)
    W0 = net.W.copy()
    rows = np.arange(8, dtype=np.int64)
    net.forward_backward(X, Y, rows, 1, 1)
    G = net.GW.copy()
    nr, nb = net.touched(X, rows, 1)
    opt.step(net.params, net.touched_rows, nr, nb)
    np.testing.assert_allclose(net.W, W0 - 0.5 * G, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("decay", [0.0, 0.3])
def test_schedule_periods_grow_as_specified(decay):
    s = RehashSchedule(10, 45, decay)
    assert s.periods(6) == [max(1, round(10 * math.exp(decay * t))) for t in range(6)]
    assert s.periods(3, rebuild=True) == [max(1, round(45 * math.exp(decay * t)))
                                          for t in range(3)]
    rehash_at, rebuild_at = [], []
    for b in range(1, 400):
        rh, rb = s.step(b)
        if rh:
            rehash_at.append(b)
        if rb:
            rebuild_at.append(b)
    gaps = np.diff([0] + rehash_at)
    assert list(gaps) == s.periods(len(gaps))
    assert list(np.diff([0] + rebuild_at)) == s.periods(len(rebuild_at), rebuild=True)
    if decay == 0:
        assert set(gaps) == {10}
    else:
        assert all(gaps[1:] >= gaps[:-1]) and gaps[-1] > 3 * gaps[0]
    # the state round-trips
    s2 = RehashSchedule(10, 45, decay)
    s2.set_state(s.state())
    assert [s2.step(b) for b in range(400, 500)] == [s.step(b) for b in range(400, 500)]


def test_rehash_and_rebuild_keep_every_neuron_findable():
    """bucket_size >= n_neurons, so no bucket overflows: after every rehash/rebuild each
    neuron must sit, in every table, in the bucket its current weights hash to."""
    rng = np.random.default_rng(3)
    X, Y = _data(rng, 64, 40, 120)
    lsh = dict(LSH, bucket_size=128)
    net = Network((40, 16, 120), [False, True], [0, 5], seed=3, lsh=lsh)
    net.build_indices()
    net.prepare(16, 2, 2)
    opt = SparseOptimizer("adam", net.layout, 5e-2)
    sched = RehashSchedule(2, 5, 0.2)
    seeds = set()
    n_checks = 0
    for b in range(1, 25):
        rows = rng.choice(64, 16, replace=False).astype(np.int64)
        net.train_batch(X, Y, rows, 7, b, opt)
        rh, rb = sched.step(b)
        if rb:
            net.rebuild()
        elif rh:
            net.rehash()
        if rh or rb:
            idx = net.indices[1]
            seeds.add(idx.seed)
            codes = hash_dense_batch(idx.hf, net.weight_rows(1))
            for t in range(idx.L):
                assert idx.offsets[t, -1] == 120           # nobody dropped
                for j in range(120):
                    assert j in idx.bucket(t, codes[j, t])
            n_checks += 1
    assert n_checks >= 6 and len(seeds) >= 3                # rebuilds drew new functions


def test_exact_predict_matches_numpy():
    rng = np.random.default_rng(4)
    X, Y = _data(rng, 30, 50, 77)
    net = Network((50, 6, 5, 77), [False, False, False], [0, 0, 0], seed=4)
    net.B[:] = rng.normal(0, 1, net.B.shape)
    S = net.predict_scores(X)
    # reference scores in float64
    lay = net.layout
    H = np.maximum(X.toarray() @ lay.weight_view(net.W, 0) + lay.bias_view(net.B, 0), 0)
    H = np.maximum(H @ lay.weight_view(net.W, 1).T + lay.bias_view(net.B, 1), 0)
    Sr = H @ lay.weight_view(net.W, 2).T + lay.bias_view(net.B, 2)
    np.testing.assert_allclose(S, Sr, rtol=1e-4, atol=1e-5)
    top = net.predict_topk_exact(X, 5, block=7, chunk=10)   # several blocks and chunks
    np.testing.assert_array_equal(top, np.argsort(-Sr, axis=1, kind="stable")[:, :5])


def test_sparse_predict_returns_active_neurons_best_first():
    rng = np.random.default_rng(5)
    X, Y = _data(rng, 20, 50, 200)
    net = Network((50, 16, 200), [False, True], [0, 10], seed=5, lsh=LSH)
    net.build_indices()
    top = net.predict_topk_sparse(X, 4)
    S = net.predict_scores(X)
    assert top.shape == (20, 4) and (top >= 0).all()
    for i in range(20):
        s = S[i, top[i]]
        assert all(s[:-1] >= s[1:] - 1e-5)
        assert len(set(top[i].tolist())) == 4


def test_sparse_predict_finds_the_neuron_lsh_must_find():
    """Recall: plant, for each row, an output neuron whose weights are the row's unit hidden
    vector times 3 (DWTA is rank-based: same buckets in every table, and the best score by far).
    Sparse serving must return it first for every row; without prior candidates, so only the
    LSH retrieval can bring it in."""
    rng = np.random.default_rng(9)
    X, Y = _data(rng, 20, 50, 200)
    net = Network((50, 16, 200), [False, True], [0, 10], seed=9,
                  lsh=dict(LSH, sampler="topk", budget=40, bucket_size=64))
    lay = net.layout
    lay.weight_view(net.W, 1)[:] *= 0.1
    H = net.hidden(X)
    keep = np.flatnonzero((H > 0).sum(1) >= 4)          # rows with an informative hidden layer
    assert len(keep) >= 10
    planted = rng.choice(200, len(keep), replace=False)
    for i, j in zip(keep, planted):
        lay.weight_view(net.W, 1)[j] = 3.0 * H[i] / np.linalg.norm(H[i])   # cos 1 beats all
    net.build_indices()
    top = net.predict_topk_sparse(X[keep], 3)
    np.testing.assert_array_equal(net.predict_topk_exact(X[keep], 1)[:, 0], planted)
    np.testing.assert_array_equal(top[:, 0], planted)
    # and LSH does not return everything: the candidate sets are a small part of the layer
    cands = [len(net.indices[1].candidates(H[i])) for i in keep]
    assert np.mean(cands) < 100


def test_sparse_predict_prior_candidates_join_every_row():
    rng = np.random.default_rng(8)
    X, Y = _data(rng, 25, 50, 200)
    net = Network((50, 16, 200), [False, True], [0, 10], seed=8, lsh=LSH)
    lay = net.layout
    lay.bias_view(net.B, 1)[:] = rng.normal(0, 1, 200)
    net.build_indices()
    bo = lay.bias_view(net.B, 1)
    prior = net.prior_ids(7)
    assert sorted(prior.tolist()) == sorted(np.argsort(-bo)[:7].tolist())
    assert net.prior_ids(0).shape == (0,) and net.prior_ids(10**6).shape == (200,)
    # with every output neuron a prior candidate, sparse serving is exact top-k
    full = net.predict_topk_sparse(X, 5, prior_candidates=200)
    np.testing.assert_array_equal(full, net.predict_topk_exact(X, 5))
    # a label with an overwhelming bias wins every row once it is a prior candidate
    star = int(np.argmin(bo))
    bo[star] = 1e3
    assert (net.predict_topk_sparse(X, 3, prior_candidates=1)[:, 0] == star).all()


@pytest.mark.parametrize("loss", ["softmax", "sigmoid", "softmax_each"])
def test_dense_blas_path_equals_per_sample_path(loss):
    """sampler='dense' trains through BLAS matrix products over the batch; with one thread it
    must follow the per-sample kernel (every neuron active) step for step."""
    import numba
    rng = np.random.default_rng(6)
    X, Y = _data(rng, 64, 80, 30, nnz=6, ny=2)
    old = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        nets = [Network((80, 12, 7, 30), [False] * 3, [0] * 3, loss=loss, seed=6)
                for _ in range(2)]
        opts = [SparseOptimizer("adam", n.layout, 1e-2)
                for n in nets]
        for n in nets:
            n.prepare(16, 1, 2)
        for b in range(4):
            rows = np.arange(16 * b, 16 * b + 16, dtype=np.int64)
            la, _ = nets[0].train_batch(X, Y, rows, 0, b + 1, opts[0])
            lb, _ = nets[1].train_batch_dense(X, Y, rows, b + 1, opts[1])
            assert la == pytest.approx(lb, rel=1e-5)
        np.testing.assert_allclose(nets[0].W, nets[1].W, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(nets[0].B, nets[1].B, rtol=1e-4, atol=1e-6)
        assert np.abs(nets[0].W - Network((80, 12, 7, 30), [False] * 3, [0] * 3,
                                          seed=6).W).max() > 1e-3   # it did train
    finally:
        numba.set_num_threads(old)


def test_dense_softmax_row_equals_the_general_loss():
    """The dense path's vectorised softmax (``dense.softmax_row``) gives the general kernel's
    loss and deltas, also for a row without labels (nothing) and an overflowed row (NaN,
    zero deltas)."""
    from slide.kernels.sample import output_loss
    from slide.network.dense import NO_CORRECTION, softmax_row
    rng = np.random.default_rng(11)
    empty = np.zeros(0, np.float32)
    for labels in ([3], [0, 7, 99], []):
        labels = np.array(labels, np.int32)
        z = rng.normal(0, 3, 100).astype(np.float32)
        want, got = z.copy(), z.copy()
        lw = output_loss(want, 100, True, labels, labels, 0, 0.25, want, NO_CORRECTION,
                         empty, None)
        lg = softmax_row(got, labels, 0.25)
        assert lg == pytest.approx(lw, rel=1e-6, abs=1e-12)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-9)
    z = np.ones(100, np.float32)
    z[5] = np.inf
    assert math.isnan(softmax_row(z, np.array([1], np.int32), 1.0))
    assert not z.any()


def test_incremental_rehash_equals_full_rehash():
    """The output layer re-hashes only rows updated since the last (re)hash; the tables must
    be exactly those LSHIndex.rehash builds from all rows."""
    from slide.kernels.lsh.index import LSHIndex
    rng = np.random.default_rng(8)
    X, Y = _data(rng, 64, 40, 500)
    net = Network((40, 16, 500), [False, True], [0, 0], seed=8, lsh=dict(LSH, bucket_size=4),
                  shared_negatives=20)
    net.build_indices()
    net.prepare(16, 2, 2)
    opt = SparseOptimizer("adam", net.layout, 5e-2)
    for b in range(1, 13):
        rows = rng.choice(64, 16, replace=False).astype(np.int64)
        net.train_batch(X, Y, rows, 7, b, opt)
        if b % 4 == 0:
            ref = LSHIndex.from_state(net.indices[1].state_dict())
            ref.rehash(net.weight_rows(1))
            net.rehash(b)
            assert 0 < net.last_dirty < 500          # really incremental
            assert np.array_equal(net.indices[1].offsets, ref.offsets)
            assert np.array_equal(net.indices[1].items, ref.items)
    seed = net.indices[1].seed
    net.rebuild(12)
    assert net.indices[1].seed != seed
    ref = LSHIndex.from_state(net.indices[1].state_dict())   # validates params vs seed
    ref.rehash(net.weight_rows(1))
    net.rehash(12)
    assert np.array_equal(net.indices[1].items, ref.items)


def _reference_tables(codes, cap, policy, seed, n_buckets):
    """Slow, obviously-correct tables: per table, insert the neurons in the index's insertion
    order; FIFO keeps each bucket's last `cap` arrivals in arrival order, reservoir runs
    Algorithm R with the index's own random stream."""
    from slide.kernels.rng import randint, stream_seed
    from slide.kernels.rng import STREAM_RESERVOIR as _STREAM_RESERVOIR
    from slide.kernels.lsh.index import insertion_order
    N, L = codes.shape
    offsets = np.zeros((L, n_buckets + 1), np.int32)
    items = np.full((L, N), -1, np.int32)
    for l in range(L):
        kept = [[] for _ in range(n_buckets)]
        seen = [0] * n_buckets
        state = np.uint64(stream_seed(np.uint64(seed), _STREAM_RESERVOIR, l))
        for i in insertion_order(N, seed, l):
            b = int(codes[i, l])
            if policy == 0:
                kept[b] = (kept[b] + [int(i)])[-cap:]
            elif seen[b] < cap:
                kept[b].append(int(i))
            else:
                state, q = randint(state, seen[b] + 1)
                state = np.uint64(state)   # back from Python int to the kernel's uint64
                if q < cap:
                    kept[b][q] = int(i)
            seen[b] += 1
        flat = [i for b in kept for i in b]
        offsets[l, 1:] = np.cumsum([len(b) for b in kept])
        items[l, :len(flat)] = flat
    return offsets, items


def test_table_build_equals_slow_reference_and_row_hashing_equals_batch_hashing():
    """build_tables_into (used by the engine's refill) must give exactly the tables of a slow
    reference (overflowing buckets, both policies), and the engine's in-place row hashing
    exactly hash_dense_batch's bucket ids."""
    from slide.kernels.lsh.hashes import draw_hash_functions, hash_dense_batch
    from slide.kernels.lsh.index import build_tables_into
    from slide.kernels.lsh.index import hash_rows_into
    rng = np.random.default_rng(3)
    W = rng.standard_normal((3000, 16)).astype(np.float32)
    hf = draw_hash_functions("dwta", 16, 2, 6, 6, 11)
    ref_codes = hash_dense_batch(hf, W)
    codes = np.full_like(ref_codes, -7)
    hash_rows_into(hf.family_code, hf.K, hf.L, hf.bits, hf.int_params, hf.float_params, W,
                   True, np.zeros(0, np.int64), codes)
    assert np.array_equal(codes, ref_codes)
    some = np.array([5, 17, 2999], np.int64)
    W2 = W.copy()
    W2[some] = rng.standard_normal((3, 16)).astype(np.float32)
    hash_rows_into(hf.family_code, hf.K, hf.L, hf.bits, hf.int_params, hf.float_params, W2,
                   False, some, codes)
    assert np.array_equal(codes, hash_dense_batch(hf, W2))
    for policy in (0, 1):
        off = np.full((6, 2 ** 6 + 1), -3, np.int32)
        items = np.full((6, 3000), -3, np.int32)
        build_tables_into(ref_codes, 8, policy, np.uint64(99), off, items)
        ref_off, ref_items = _reference_tables(ref_codes, 8, policy, 99, 2 ** 6)
        assert (np.diff(off, axis=1) == 8).any()          # buckets did overflow
        assert np.array_equal(off, ref_off)
        assert np.array_equal(items, ref_items)
