"""The engine's default loss path against brute force, thread-count independence, sparse
Adam's catch-up at small step counts, sigmoid with a sampled output layer, and the state
round trips of Network / SparseOptimizer / LSHIndex.refresh."""
import numba
import numpy as np
import pytest

from slide.network import Network
from slide.network.diagnostics import first_layer_gradient
from slide.network.optim import SparseOptimizer
from test_layers import _reference, _sample
from test_network import _data
from test_optim import _dense_adam, _sparse_adam

C = 300          # output neurons
LSH = dict(sampler="vanilla", family="dwta", K=2, L=4, range_pow=6, bucket_size=8,
           policy="fifo", budget=400, threshold=1)      # budget > any candidate set


def _default_net(min_active, loss="softmax", seed=3, n_shared=30):
    """A tiny network set up as SlideClassifier's default: frequency-weighted shared
    negatives with the importance correction, LSH candidates, optional uniform fill."""
    net = Network((40, 16, C), [False, True], [0, min_active], loss=loss, seed=seed, lsh=LSH,
                  shared_negatives=n_shared, correct=True, negative_power=1.0)
    net.W *= 8.0
    net.B[:] = np.random.default_rng(seed).normal(0, 0.3, net.B.shape)
    counts = np.random.default_rng(seed + 1).zipf(1.5, C).clip(max=500)
    net.set_label_counts(counts)
    net.build_indices()
    return net, counts


def _brute_force_offsets(net, counts, x_idx, x_val, labels, active, n_shared):
    """The logit offsets of the default loss, from scratch. Layout: the labels, every LSH
    candidate (C, chosen without the shared draw), the shared negatives (drawn from the same
    (seed, serial) stream) not in C, the uniform fill. Shared: -log P(drawn at least once);
    a fill present for every draw (|active| - |C| > draws): shared log((1 + 1/P) / 2), fill
    log(U' / |fill|) + log(1/2); a fill present only for some draws: left out."""
    lay = net.layout
    x = np.zeros(40)
    x[x_idx] = x_val
    h = np.maximum(x @ lay.weight_view(net.W, 0) + lay.bias_view(net.B, 0), 0)
    cands = set(net.indices[1].candidates(h.astype(np.float32)).tolist())
    shared = net.negatives.draw(net.seed, 1)
    q = (counts + 1.0) ** 1.0
    q /= q.sum()
    p_in = 1.0 - (1.0 - q) ** n_shared
    ny = len(labels)
    lab = set(labels.tolist())
    assert active[:ny].tolist() == labels.tolist()
    lsh_part = sorted(cands - lab)
    n_c = ny + len(lsh_part)
    assert sorted(active[ny:n_c].tolist()) == lsh_part       # labels, then every LSH candidate
    in_c = lab | cands
    sh = [j for j in shared.tolist() if j not in in_c]
    n_s = n_c + len(sh)
    assert active[n_c:n_s].tolist() == sh                    # then the shared negatives
    fill = active[n_s:]
    off = np.zeros(C)
    off[sh] = -np.log(p_in[sh])
    kind = "none"
    if len(fill):
        if len(active) - n_c > n_shared:
            kind = "mixed"
            off[sh] = np.log(0.5 + 0.5 / p_in[sh])
            off[fill] = np.log((C - n_s) / len(fill)) + np.log(0.5)
        else:
            kind = "dropped"
            off[fill] = -1e4       # exp underflows to 0: left out (the reference takes no -inf)
    return off, len(lsh_part), len(fill), kind


@pytest.mark.parametrize("min_active", [0, 150, 32])
def test_default_loss_matches_brute_force(min_active):
    net, counts = _default_net(min_active)
    rng = np.random.default_rng(11)
    n_lsh = n_fill = 0
    kinds = set()
    for _ in range(3):
        idx, val, lab = _sample(rng, 40, C, ny=2)
        L, gW, gB, act = net.sample_loss_and_grads(idx, val, lab, serial=1,
                                                   return_active=True)
        a = act[1]
        off, nl, nf, kind = _brute_force_offsets(net, counts, idx, val, lab, a, 30)
        kinds.add(kind)
        n_lsh += nl
        n_fill += nf
        Lr, gWr, gBr = _reference(net.layout, net.W, net.B, idx, val, lab, "softmax",
                                  active=[None, a], offset=off)
        assert L == pytest.approx(Lr, rel=1e-5)
        np.testing.assert_allclose(gW, gWr, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(gB, gBr, rtol=1e-4, atol=1e-6)
        # the correction matters: without the offsets the loss is different
        L0 = _reference(net.layout, net.W, net.B, idx, val, lab, "softmax", active=[None, a])[0]
        assert abs(L - L0) > 1e-2
    assert n_lsh > 0                      # LSH candidates really were mixed in
    assert (n_fill > 0) == (min_active > 0)
    # min_active 32: the fill is not there for every draw (32 - |C| <= 30 draws): left out
    assert kinds - {"none"} == {0: set(), 150: {"mixed"}, 32: {"dropped"}}[min_active]


def _random_sampler_net(min_active, n_shared, seed=4):
    """A tiny network with SlideClassifier's default output layer: sampler "random" (no LSH),
    frequency-drawn shared negatives with the sampling correction, optional uniform fill."""
    net = Network((40, 16, C), [False, True], [0, min_active], seed=seed,
                  shared_negatives=n_shared, correct=True, negative_power=1.0)
    assert not net.uses_tables
    net.W *= 8.0
    net.B[:] = np.random.default_rng(seed).normal(0, 0.3, net.B.shape)
    counts = np.random.default_rng(seed + 1).zipf(1.5, C).clip(max=500)
    net.set_label_counts(counts)
    return net, counts


@pytest.mark.parametrize("min_active", [0, 150, 32])
def test_random_sampler_loss_matches_sampled_softmax_from_draw_probabilities(min_active):
    """The default sampler's loss and gradients against the sampled softmax written from its
    definition in float64. Per draw probability q_j = (count_j + 1) / sum(count + 1) and n
    draws, a shared negative j (not a label) is in the set with P_j = 1 - (1 - q_j)^n and its
    logit is offset by -log P_j (Horvitz-Thompson); the labels are exact (offset 0). With a
    uniform fill F present for every draw (min_active - |y| > n), shared and fill estimate
    the rest half each: shared log((1 + 1/P_j) / 2), fill log((C - |y| - |S \\ y|) / |F|)
    + log(1/2); a fill present only for some draws gets no mass. One label is chosen among
    the drawn neurons (so a correction wrongly given to a label shows)."""
    n_sh = 30
    net, counts = _random_sampler_net(min_active, n_sh)
    q = (counts + 1.0) / (counts + 1.0).sum()
    P = 1.0 - (1.0 - q) ** n_sh
    rng = np.random.default_rng(21)
    for serial in (1, 2, 3):
        drawn = net.negatives.draw(net.seed, serial)        # the ids only
        # a drawn label that is far from certain to be drawn, and one label not drawn
        lab_in = drawn[np.argmin(P[drawn])]
        assert P[lab_in] < 0.5
        lab_out = rng.choice(np.setdiff1d(np.arange(C), drawn))
        lab = np.sort(np.array([lab_in, lab_out], np.int32))
        idx = np.sort(rng.choice(40, 6, replace=False)).astype(np.int32)
        val = rng.uniform(0.2, 1.0, 6).astype(np.float32)
        L, gW, gB, act = net.sample_loss_and_grads(idx, val, lab, serial=serial,
                                                   return_active=True)
        a = act[1]
        # the active set: the labels, the drawn ids that are not labels, the fill
        sh = np.setdiff1d(drawn, lab)
        assert a[:2].tolist() == lab.tolist()
        assert sorted(a[2:2 + len(sh)].tolist()) == sh.tolist()
        fill = a[2 + len(sh):]
        assert len(a) == max(min_active, 2 + len(sh)) and len(set(a.tolist())) == len(a)
        assert not np.isin(fill, drawn).any() and not np.isin(fill, lab).any()
        off = np.zeros(C)
        if len(fill) and min_active - 2 > n_sh:          # the fill is there for every draw
            off[sh] = np.log((1.0 + 1.0 / P[sh]) / 2.0)
            off[fill] = np.log((C - 2 - len(sh)) / len(fill)) + np.log(0.5)
        else:
            off[sh] = -np.log(P[sh])
            off[fill] = -1e4            # no softmax mass (the reference takes no -inf)
        assert (len(fill) > 0) == (min_active > 0)
        Lr, gWr, gBr = _reference(net.layout, net.W, net.B, idx, val, lab, "softmax",
                                  active=[None, a], offset=off)
        assert L == pytest.approx(Lr, rel=1e-5)
        np.testing.assert_allclose(gW, gWr, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(gB, gBr, rtol=1e-4, atol=1e-6)
        assert np.abs(net.layout.bias_view(gBr, 1)[sh]).max() > 1e-4   # the draw carries mass


def test_sigmoid_with_sampled_output_layer_matches_reference():
    """Binary cross-entropy over the active outputs only (no sampling correction), with the
    labels and shared negatives forced and LSH candidates added."""
    net, _ = _default_net(60, loss="sigmoid")
    rng = np.random.default_rng(12)
    for serial in (1, 2):
        idx, val, lab = _sample(rng, 40, C, ny=3)
        L, gW, gB, act = net.sample_loss_and_grads(idx, val, lab, serial=serial,
                                                   return_active=True)
        a = act[1]
        assert set(lab.tolist()) <= set(a.tolist()) and 60 <= len(a) < C
        Lr, gWr, gBr = _reference(net.layout, net.W, net.B, idx, val, lab, "sigmoid",
                                  active=[None, a])
        assert L == pytest.approx(Lr, rel=1e-5)
        np.testing.assert_allclose(gW, gWr, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(gB, gBr, rtol=1e-4, atol=1e-6)
        inactive = np.setdiff1d(np.arange(C), a)
        assert not net.layout.weight_view(gW, 1)[inactive].any()
        assert np.abs(net.layout.weight_view(gW, 1)[a]).max() > 1e-3


def _batch_gradients(net, X, Y, rows, n_threads):
    old = numba.get_num_threads()
    numba.set_num_threads(n_threads)
    try:
        net.GW[:] = 0
        net.GB[:] = 0
        net._scratch_key = None
        net.prepare(len(rows), n_threads, 2)
        losses = net.forward_backward(X, Y, rows, 5, 3).copy()
        GW = net.GW.copy()
        if net.fused_first:
            # the batched engine forms the first layer's gradient in its update step
            net.layout.weight_view(GW, 0)[:] += first_layer_gradient(net, X, rows)
        return (losses, GW, net.GB.copy(), net.store.d_store.copy(),
                net.store.h_store.copy(), net.sc.ids.copy())
    finally:
        numba.set_num_threads(old)


@pytest.mark.parametrize("engine", ["per_sample", "batched"])
def test_batch_gradient_at_one_and_two_threads_agrees(engine):
    assert numba.config.NUMBA_NUM_THREADS >= 2       # tests/conftest.py asks for 2
    rng = np.random.default_rng(13)
    n, nnz, n_features = 64, 8, 512
    X, Y = _data(rng, n, n_features, C, nnz=nnz, ny=2)
    # every sample its own input features: no two threads add into one first-layer row, so
    # that layer's gradient is race-free and must agree exactly (HOGWILD's lost updates, by
    # design, only hit rows that samples share)
    X.indices[:] = np.sort(rng.permutation(n_features)[:n * nnz].reshape(n, nnz),
                           axis=1).ravel().astype(np.int32)
    net = Network((n_features, 16, C), [False, True], [0, 50], seed=3, lsh=LSH,
                  shared_negatives=30, correct=True, negative_power=1.0, engine=engine)
    net.W *= 8.0
    net.set_label_counts(np.random.default_rng(4).zipf(1.5, C).clip(max=500))
    net.build_indices()
    rows = np.arange(n, dtype=np.int64)
    one = _batch_gradients(net, X, Y, rows, 1)
    two = _batch_gradients(net, X, Y, rows, 2)
    np.testing.assert_array_equal(one[5], two[5])          # same active sets: no thread RNG
    np.testing.assert_array_equal(one[0], two[0])          # per-sample losses
    np.testing.assert_array_equal(one[3], two[3])          # per-sample output deltas
    np.testing.assert_array_equal(one[4], two[4])          # per-sample output inputs
    w0 = net.layout.weight_view(one[1], 0).shape
    np.testing.assert_array_equal(net.layout.weight_view(one[1], 0),
                                  net.layout.weight_view(two[1], 0))
    assert w0[0] == n_features and np.abs(one[1]).max() > 1e-3
    # the hidden biases take an add from every sample (the hottest floats): their gradient
    # keeps its scale
    assert abs(np.abs(one[2]).sum() - np.abs(two[2]).sum()) < 0.5 * np.abs(one[2]).sum()


def _catch_up_error(t0, touch, n=6, n_steps=40, lr=1e-2, seed=0):
    """Max |sparse Adam with catch-up - dense Adam| after n_steps starting at step t0, and
    the largest movement of dense Adam over the run."""
    rng = np.random.default_rng(seed)
    w0 = rng.standard_normal((1, n)).astype(np.float32)
    grads = [{0: rng.standard_normal(n)} if (i + 1) in touch else {} for i in range(n_steps)]
    ref = _dense_adam(w0, grads, [lr] * n_steps, t0)[-1]
    got = _sparse_adam(w0, grads, [lr] * n_steps, t0, flush_at=(n_steps,))[n_steps]
    return np.abs(got - ref).max(), np.abs(ref - w0).max()


@pytest.mark.parametrize("touch", [(1, 5), (1, 2, 30), (1, 20)])
def test_catch_up_adam_versus_dense_adam_at_small_step_counts(touch):
    """Early in training (t < ~1000) the bias-corrected step size still changes from step to
    step; the catch-up applies each missed step at its own recorded rate, so it is dense Adam
    there too (the engine before issue 28 used the rate of the step that catches up: off by
    5-25 % of the run's movement at t0 = 1)."""
    for t0 in (0, 1000, 100_000):
        err, move = _catch_up_error(t0, touch)
        assert err < 1e-5 * move + 1e-6, t0


def test_network_and_optimizer_state_round_trip():
    rng = np.random.default_rng(14)
    X, Y = _data(rng, 64, 40, C, nnz=8, ny=2)
    net, _ = _default_net(40)
    opt = SparseOptimizer("adam", net.layout, 1e-2)
    net.prepare(16, 1, 2)
    for b in range(1, 4):
        net.train_batch(X, Y, np.arange(16 * b - 16, 16 * b, dtype=np.int64), 7, b, opt)
    net.rehash(3)
    ns, os_ = net.state_dict(), opt.state_dict()
    import json
    json.dumps(ns["meta"])
    json.dumps(os_["meta"])
    net2 = Network.from_state(ns)
    opt2 = SparseOptimizer.from_state(net2.layout, os_)
    assert np.array_equal(net2.W, net.W) and np.array_equal(net2.B, net.B)
    np.testing.assert_array_equal(net2.predict_topk_sparse(X, 5), net.predict_topk_sparse(X, 5))
    # both continue identically (one thread: no HOGWILD races)
    old = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        for n, o in ((net, opt), (net2, opt2)):
            n._scratch_key = None
            n.prepare(16, 1, 2)
            n.train_batch(X, Y, np.arange(48, 64, dtype=np.int64), 7, 4, o)
            o.flush(n.W, n.B)
    finally:
        numba.set_num_threads(old)
    assert np.array_equal(net2.W, net.W) and np.array_equal(opt2.MW, opt.MW)
    assert opt2.t == opt.t == 4
    bad = {"meta": dict(ns["meta"]), "arrays": dict(ns["arrays"])}
    bad["arrays"]["W"] = bad["arrays"]["W"][:-1]
    with pytest.raises(ValueError, match="'W'"):
        Network.from_state(bad)
    with pytest.raises(ValueError, match="opt_MW"):
        SparseOptimizer.from_state(net.layout, {"meta": os_["meta"], "arrays": {}})


def test_index_refresh_of_dirty_rows_equals_full_rehash_and_rebuild_seed_rule():
    from slide.kernels.rng import STREAM_REBUILD, derived_seed
    from slide.kernels.lsh.index import LSHIndex
    rng = np.random.default_rng(15)
    W = rng.standard_normal((500, 16)).astype(np.float32)
    a = LSHIndex("dwta", 16, 2, 5, 6, bucket_size=4, seed=9).build(W)
    b = LSHIndex("dwta", 16, 2, 5, 6, bucket_size=4, seed=9).build(W)
    dirty = np.array([3, 77, 499], np.int64)
    W[dirty] = rng.standard_normal((3, 16)).astype(np.float32)
    a.refresh(W, dirty)
    b.rehash(W)
    assert np.array_equal(a.items, b.items) and np.array_equal(a.offsets, b.offsets)
    assert a.generation == b.generation == 1
    seed = a.seed
    a.rebuild(W)
    assert a.seed == derived_seed(seed, STREAM_REBUILD) and a.generation == 0
