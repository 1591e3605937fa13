"""The batched engine (slide.network.block) against the per-sample reference path
(slide.network.batch): the same losses, gradients and updates to float32 tolerance, for every
sampler, both losses, dense and sparse hidden layers, with and without a random fill."""
import numba
import numpy as np
import pytest

from slide.network import Network
from slide.network.optim import SparseOptimizer
from test_network import _data

C = 300
LSH = dict(family="dwta", K=2, L=4, range_pow=6, bucket_size=8, policy="fifo", budget=40,
           threshold=2)


def _net(engine, sampler, loss, sparse_hidden, min_active, seed=3, head=0):
    lsh = dict(LSH, sampler=sampler)
    net = Network((40, 16, C), [sparse_hidden, True], [8 if sparse_hidden else 0, min_active],
                  loss=loss, seed=seed, lsh=lsh, shared_negatives=30, correct=True,
                  negative_power=1.0, engine=engine, shared_head=head)
    net.W *= 4.0
    net.B[:] = np.random.default_rng(seed).normal(0, 0.3, net.B.shape)
    net.set_label_counts(np.random.default_rng(seed + 1).zipf(1.5, C).clip(max=500))
    net.build_indices()
    return net


def _train(engine, sampler, loss, sparse_hidden, min_active, optimizer, n_batches, head=0):
    rng = np.random.default_rng(11)
    X, Y = _data(rng, 96, 40, C, nnz=8, ny=3)
    net = _net(engine, sampler, loss, sparse_hidden, min_active, head=head)
    opt = SparseOptimizer(optimizer, net.layout, 1.0 if optimizer == "sgd" else 1e-2)
    # one thread: HOGWILD's racy adds into shared rows may drop an update with two (by
    # design), which would hide a real difference between the paths
    old = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        net.prepare(32, 1, 8)
        losses = []
        for b in range(n_batches):
            rows = np.arange(32 * b, 32 * (b + 1), dtype=np.int64) % 96
            loss_b, _ = net.train_batch(X, Y, rows, 5, b + 1, opt)
            losses.append(loss_b)
    finally:
        numba.set_num_threads(old)
    return net, np.array(losses)


@pytest.mark.parametrize("sampler", ["random", "vanilla", "topk", "threshold"])
@pytest.mark.parametrize("loss", ["softmax", "sigmoid", "softmax_each"])
@pytest.mark.parametrize("sparse_hidden,min_active", [(False, 0), (False, 50), (True, 0)])
def test_batched_step_equals_per_sample_step(sampler, loss, sparse_hidden, min_active):
    """One SGD step at learning rate 1: the weights move by exactly minus the gradient, so
    equal weights after it mean equal gradients of every layer (output rows of the shared
    block, the extras, the hidden layers)."""
    args = (sampler, loss, sparse_hidden, min_active)
    ref, l_ref = _train("per_sample", *args, "sgd", 1)
    got, l_got = _train("batched", *args, "sgd", 1)
    assert got.batched and not ref.batched
    np.testing.assert_allclose(l_got, l_ref, rtol=1e-5)
    assert np.isfinite(l_ref).all() and l_ref[0] > 0
    w0 = _net("per_sample", *args).W
    moved = np.abs(ref.W - w0).max()
    assert moved > 1e-3                                     # the step did something
    np.testing.assert_allclose(got.W, ref.W, rtol=0, atol=2e-5 * max(1.0, moved))
    np.testing.assert_allclose(got.B, ref.B, rtol=0, atol=2e-5)


@pytest.mark.parametrize("sampler", ["random", "vanilla"])
@pytest.mark.parametrize("loss", ["softmax", "sigmoid", "softmax_each"])
@pytest.mark.parametrize("min_active", [0, 50])
def test_extras_cut_into_tasks_give_the_per_sample_step(sampler, loss, min_active,
                                                        monkeypatch):
    """Samples with more than ``EXTRAS_TASK`` extras have their extras' logits and dH share
    computed as tasks beside the products (``extras_tasks``): the step is still the
    per-sample path's, and tasks really ran."""
    from slide.network import block_step
    from slide.network.extras import extras_tasks
    args = (sampler, loss, False, min_active)
    ref, l_ref = _train("per_sample", *args, "sgd", 1)
    monkeypatch.setattr(block_step, "EXTRAS_TASK", 2)
    got, l_got = _train("batched", *args, "sgd", 1)
    # the batch's samples have extras enough for many tasks of two
    assert extras_tasks(got.block.counts, 32, 2)[0].shape[0] > 10
    moved = np.abs(ref.W - _net("per_sample", *args).W).max()
    np.testing.assert_allclose(l_got, l_ref, rtol=1e-5)
    np.testing.assert_allclose(got.W, ref.W, rtol=0, atol=2e-5 * max(1.0, moved))
    np.testing.assert_allclose(got.B, ref.B, rtol=0, atol=2e-5)


def test_extras_tasks_cover_each_heavy_samples_extras_once():
    from slide.network.extras import extras_tasks
    counts = np.zeros((6, 3), np.int64)
    counts[:, 2] = [0, 5, 64, 65, 200, 3]
    tasks, ptr = extras_tasks(counts, 6, 64)
    np.testing.assert_array_equal(ptr, [0, 0, 0, 0, 2, 6, 6])
    np.testing.assert_array_equal(tasks, [[3, 0, 64], [3, 64, 65], [4, 0, 64], [4, 64, 128],
                                          [4, 128, 192], [4, 192, 200]])


@pytest.mark.parametrize("sampler", ["random", "vanilla"])
@pytest.mark.parametrize("min_active", [0, 50])
def test_batched_step_with_exact_head_equals_per_sample_step(sampler, min_active):
    """With an exact head (the most frequent labels in every block, weight 1) both engines
    take the same step, and the head really is in the block."""
    args = (sampler, "softmax", False, min_active)
    ref, l_ref = _train("per_sample", *args, "sgd", 1, head=10)
    got, l_got = _train("batched", *args, "sgd", 1, head=10)
    head = got.negatives.head
    assert head.shape[0] == 10 and np.isin(head, got.block_shared).all()
    np.testing.assert_allclose(l_got, l_ref, rtol=1e-5)
    moved = np.abs(ref.W - _net("per_sample", *args, head=10).W).max()
    np.testing.assert_allclose(got.W, ref.W, rtol=0, atol=2e-5 * max(1.0, moved))
    # and the head changes the step (the draw and the weights differ without it)
    other, _ = _train("batched", *args, "sgd", 1, head=0)
    assert np.abs(other.W - got.W).max() > 1e-4


@pytest.mark.parametrize("sampler", ["random", "vanilla"])
def test_batched_adam_run_follows_per_sample_run(sampler):
    """Several Adam steps with catch-up: the step records and stamps of the shared block's
    rows are kept as the per-sample path keeps them."""
    ref, l_ref = _train("per_sample", sampler, "softmax", False, 0, "adam", 3)
    got, l_got = _train("batched", sampler, "softmax", False, 0, "adam", 3)
    np.testing.assert_allclose(l_got, l_ref, rtol=1e-4)
    np.testing.assert_allclose(got.W, ref.W, rtol=0, atol=1e-4)
    np.testing.assert_allclose(got.B, ref.B, rtol=0, atol=1e-4)
    np.testing.assert_array_equal(got.out_stamp, ref.out_stamp)


@pytest.mark.parametrize("head", [0, 10])
def test_draw_ahead_is_the_draw_and_leaves_the_listing(head):
    """``block._draw``: the frequency draw made ahead gives the ids and inclusion weights of
    ``SharedNegatives.draw``; the first layer's listing is block_forward's
    (``touched.feature_entries``)."""
    from slide.kernels.arrays import csr
    from slide.kernels.negatives import inclusion_weights
    from slide.kernels.touched import feature_entries
    from slide.network import block as BK
    rng = np.random.default_rng(4)
    X, Y = _data(rng, 96, 40, C, nnz=8, ny=3)
    rows = rng.permutation(96)[:32].astype(np.int64)
    net = _net("batched", "random", "softmax", False, 0, head=head)
    net.prepare(32, 2, 8)
    ref = _net("batched", "random", "softmax", False, 0, head=head)
    for serial in (1, 2, 7):
        frows = BK.feature_rows(net, net.layout, X, rows)
        ids = BK._draw(net, 5, serial)
        assert not frows.mark.any()
        frows.count[0] = feature_entries(csr(X), rows, frows)
        # the reference in numpy: searchsorted over the cdf, the inclusion weights'
        # arithmetic on arrays, the union with the head
        neg = ref.negatives
        u = neg.uniforms(5, serial)
        tail = np.unique(np.minimum(np.searchsorted(neg.cdf, u, "right"), C - 1))
        p_in = -np.expm1(u.shape[0] * np.log1p(-np.minimum(neg.tail_q[tail], 1.0 - 1e-12)))
        corr, corr_mix = inclusion_weights(p_in)
        want = np.union1d(tail, neg.head)
        assert ids.dtype == np.int32 and np.array_equal(ids, want)
        assert np.array_equal(net.negatives.corr[tail], corr)
        assert np.array_equal(net.negatives.corr_mix[tail], corr_mix)
        assert head == 0 or not net.negatives.corr[neg.head].any()
        got = [a.copy() for a in (frows.uniq, frows.row_ptr, frows.ent_p, frows.ent_s)]
        n = int(frows.count[0])
        assert n == feature_entries(csr(X), rows, frows) > 0
        assert np.array_equal(got[0][:n], frows.uniq[:n])
        m = int(frows.row_ptr[n])
        assert np.array_equal(got[1][:n + 1], frows.row_ptr[:n + 1])
        assert np.array_equal(got[2][:m], frows.ent_p[:m])
        assert np.array_equal(got[3][:m], frows.ent_s[:m])
        assert not frows.mark.any()                       # the scratch is clean again


@pytest.mark.parametrize("seed", range(6))
def test_shared_ids_join_an_active_set_in_their_order_around_c(seed):
    """``sample._append_shared``: after C (any order), the ids of S not in C, in S's order,
    cut at the buffer's capacity -- what stamping each id of S in a mark array gave."""
    from slide.kernels.sample import _append_shared
    rng = np.random.default_rng(seed)
    shared = np.sort(rng.choice(500, 60, replace=False)).astype(np.int32)
    C = rng.permutation(np.concatenate([rng.choice(shared, rng.integers(0, 12), replace=False),
                                        rng.choice(np.setdiff1d(np.arange(500), shared), 5,
                                                   replace=False)])).astype(np.int32)
    cap = [C.shape[0] + 60, C.shape[0] + 20, C.shape[0]][seed % 3]
    out = np.full(cap, -1, np.int32)
    out[:C.shape[0]] = C
    n = _append_shared(out, C.shape[0], shared, np.zeros(60, np.int32), True)
    want = [j for j in shared if j not in set(C)][:cap - C.shape[0]]
    assert n == C.shape[0] + len(want)
    np.testing.assert_array_equal(out[C.shape[0]:n], want)
    np.testing.assert_array_equal(out[:C.shape[0]], C)


@pytest.mark.parametrize("ns", [1, 3, 64, 1030])
@pytest.mark.parametrize("n_parts", [1, 2, 5])
def test_split_products_are_the_batch_products(ns, n_parts):
    """Steps 2, 3 and 5 split into blocks over Numba's threads give numpy's products, the
    gathered rows and biases of S, and dZ's column sums bit for bit summed row after row:
    every entry of a product is one dot product over the whole inner dimension, whatever the
    split."""
    from slide.kernels.arrays import Extras
    from slide.network.block import split_backward_products, split_forward_product
    from slide.network.extras import no_extras
    rng = np.random.default_rng(ns * 10 + n_parts)
    h, n_labels = 16, 2000
    H = rng.standard_normal((37, h)).astype(np.float32)
    W = rng.standard_normal(5 + n_labels * h).astype(np.float32)     # 5: another layer first
    B = rng.standard_normal(3 + n_labels).astype(np.float32)
    shared = np.sort(rng.choice(n_labels, ns, replace=False)).astype(np.int32)
    xt = no_extras(H)._replace(W=W, B=B, w_off=np.int64(5), b_off=np.int64(3))
    assert isinstance(xt, Extras)
    n_parts = min(n_parts, ns)
    WS = np.full((ns, h), np.nan, np.float32)
    bS = np.full(ns, np.nan, np.float32)
    Z = np.full((37, ns), np.nan, np.float32)
    split_forward_product(xt, shared, WS, bS, Z, n_parts)
    want_WS = W[5:].reshape(n_labels, h)[shared]
    np.testing.assert_array_equal(WS, want_WS)
    np.testing.assert_array_equal(bS, B[3:][shared])
    np.testing.assert_allclose(Z, H @ want_WS.T, rtol=1e-5, atol=1e-5)
    # WS given (no rows to gather): only the product
    Z2 = np.full((37, ns), np.nan, np.float32)
    split_forward_product(no_extras(H), shared[:0], want_WS, bS[:0], Z2, n_parts)
    np.testing.assert_array_equal(Z2, Z)
    dZ = (rng.standard_normal((37, ns)) * 10.0 ** rng.uniform(-4, 2, (37, 1))).astype(np.float32)
    dH = np.full((37, h), np.nan, np.float32)
    dWS = np.full((ns, h), np.nan, np.float32)
    dbS = np.full(ns, np.nan, np.float32)
    split_backward_products(dZ, WS, no_extras(H), dH, dWS, dbS, n_parts)
    np.testing.assert_allclose(dH, dZ @ WS, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dWS, dZ.T @ H, rtol=1e-4, atol=1e-4)
    # row after row, as np.add.accumulate; np.sum's order too, but for one column (a
    # contiguous run, which numpy sums pairwise)
    np.testing.assert_array_equal(dbS.view(np.int32),
                                  np.add.accumulate(dZ, axis=0)[-1].view(np.int32))
    if ns > 1:
        np.testing.assert_array_equal(dbS.view(np.int32), np.sum(dZ, axis=0).view(np.int32))


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_fused_row_steps_equal_the_three_steps(optimizer, n_threads, monkeypatch):
    """``SparseOptimizer.step_batch_rows`` (the first layer's, the extras' and the block's
    rows in one parallel loop, dealt in chunks) leaves every weight, moment, step record and
    stamp bit for bit where the three steps one after the other leave them, after batches
    that gave rows idle steps to catch up."""
    import copy
    from slide.kernels.touched import output_entries
    from slide.network import block_step, optim
    rng = np.random.default_rng(5)
    X, Y = _data(rng, 96, 40, C, nnz=8, ny=3)
    net = _net("batched", "random", "softmax", False, 0)
    assert net.fused_first
    opt = SparseOptimizer(optimizer, net.layout, 1e-2)
    old = numba.get_num_threads()
    numba.set_num_threads(n_threads)
    try:
        net.prepare(32, n_threads, 8)
        for b in range(4):
            net.train_batch(X, Y, (np.arange(32) * 3 + b) % 96, 5, b + 1, opt)
        rows = np.arange(32, 64, dtype=np.int64)
        # the fused loop below deals its rows in small chunks (several a thread)
        monkeypatch.setattr(block_step, "ROW_CHUNKS", optim.RowChunks(4, 8, 4))
        assert np.isfinite(net.forward_backward(X, Y, rows, 5, 5)).all()
        before = (net.W.copy(), net.B.copy(), net.out_stamp.copy(), copy.deepcopy(opt),
                  net.GW.copy(), net.GB.copy())

        def state(o):
            return [net.W, net.B, net.out_stamp] + [getattr(o, a) for a in
                                                    ("MW", "VW", "MB", "VB", "TW", "TB")]

        # the three steps, one loop each (as before the fusion)
        blk = net.block
        nr, nbias = net.touched(X, rows, 5)
        opt.step(net.params, net.touched_rows, nr, nbias)
        nu = output_entries(blk.extra[:32], blk.counts[:32, 2:3], 0,
                            net.store.d_store.shape[1], net.out_rows, np.int64(5))
        frows = net.feature_rows
        a0, a1 = int(net.sc.a_off[0]), int(net.sc.a_off[1])
        ns = net.block_shared.shape[0]
        first = (frows, int(frows.count[0]), X.data, blk.dels[:32, a0:a1])
        extras = (net.out_rows, nu, net.store)
        block = (net.block_shared, blk.dWS[:ns], blk.dbS[:ns], net.out_stamp, 5)
        assert first[1] > 0 and nu > 0 and block[0].shape[0] > 0
        opt.step_first(net.W, *first)
        opt.step_output(net.W, net.B, *extras)
        opt.step_block(net.W, net.B, *block)
        want = [a.copy() for a in state(opt)]
        # the fused loop, from the same state, in small chunks (several a thread)
        net.W[:], net.B[:], net.out_stamp[:] = before[0], before[1], before[2]
        net.GW[:], net.GB[:] = before[4], before[5]         # the hidden layers' gradients
        opt = before[3]
        net.update(X, rows, 5, opt)
        for w, g in zip(want, state(opt)):
            np.testing.assert_array_equal(g, w)
        assert not np.array_equal(want[0], before[0])
    finally:
        numba.set_num_threads(old)


def test_row_chunk_gives_every_thread_several_chunks():
    from slide.network.optim import ROW_CHUNKS, row_chunk
    ROW_CHUNK, MIN_ROW_CHUNK = ROW_CHUNKS.most, ROW_CHUNKS.least
    n = numba.get_num_threads()
    assert row_chunk(10 ** 7) == ROW_CHUNK
    assert row_chunk(0) == MIN_ROW_CHUNK
    mid = row_chunk(8 * n * 40)
    assert mid == max(MIN_ROW_CHUNK, min(ROW_CHUNK, 40))


@pytest.mark.parametrize("n_parts, n_tasks", [(1, 0), (2, 0), (2, 5), (4, 6), (4, 1), (8, 3)])
def test_products_loop_runs_every_part_and_task_once_with_parts_spread(n_parts, n_tasks):
    from slide.network.products import spread_parts
    slots = spread_parts(n_parts, n_tasks)
    n = n_parts + n_tasks
    assert sorted(slots.tolist()) == list(range(n))
    # part c sits where a halving of the loop's range starts a thread's share, not in the
    # loop's first slots (where one thread took every BLAS call of the batch)
    for c in range(n_parts):
        assert slots[c * n // n_parts] == c
    # the tasks keep their order
    tasks = [k for k in slots.tolist() if k >= n_parts]
    assert tasks == sorted(tasks)
