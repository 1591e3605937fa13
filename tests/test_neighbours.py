"""The neighbour vote (slide.rank.vote): the memory, the vote, the blended top-k, and how the
estimator, checkpoints, ensembles and sharded models treat it."""
import numpy as np
import pytest
import scipy.sparse as sp

import slide
from slide.persist import checkpoint
from slide.rank.vote import POWER, NeighbourMemory

SMALL = dict(hidden_sizes=(32,), batch_size=32, learning_rate=1e-2, lr_schedule="constant",
             n_threads=1, random_state=0)


@pytest.fixture(scope="module")
def trained(tiny):
    Xtr, Ytr, _, _ = tiny
    return slide.SlideClassifier(epochs=3, **SMALL).fit(Xtr, Ytr)


def _reference_vote(Q, E, Y, k):
    """The vote written out row by row: cosine similarities, the k largest, s ** POWER."""
    Yd = Y.toarray()
    En = E / np.maximum(np.linalg.norm(E, axis=1, keepdims=True), 1e-30)
    out = np.zeros((Q.shape[0], Y.shape[1]))
    for i, q in enumerate(Q):
        s = En @ (q / np.linalg.norm(q))
        near = np.argsort(-s, kind="stable")[:k]
        w = np.maximum(s[near], 0.0) ** POWER
        v = w @ Yd[near]
        out[i] = v / v.sum() if v.sum() > 0 else v
    return out


def test_vote_matches_a_row_by_row_reference():
    rng = np.random.default_rng(1)
    E = rng.normal(size=(50, 6)).astype(np.float32)
    Y = sp.random(50, 12, density=0.2, random_state=2, format="csr", dtype=np.float32)
    Y.data[:] = 1.0
    Q = rng.normal(size=(9, 6)).astype(np.float32)
    E0 = E.copy()
    mem = NeighbourMemory.build(E, Y)
    assert np.allclose(np.linalg.norm(mem.emb, axis=1), 1.0, atol=1e-6)
    np.testing.assert_array_equal(E, E0)            # the caller's array is left alone
    A = E0.copy()
    owned = NeighbourMemory.build(A, Y, copy=False)     # the memory is that array, normalised
    assert owned.emb is A and np.array_equal(A, mem.emb)
    for k in (1, 5, 50, 80):                      # k beyond the rows: every row votes
        V = mem.vote(Q, k).toarray()
        np.testing.assert_allclose(V, _reference_vote(Q, E, Y, min(k, 50)), atol=1e-5)
        sums = V.sum(axis=1)
        assert np.all((np.abs(sums - 1) < 1e-5) | (sums == 0))


def test_a_training_row_votes_for_its_own_labels(tiny, trained):
    Xtr, Ytr, _, _ = tiny
    mem = trained.rank_.memory
    assert mem is not None and mem.n_rows == Xtr.shape[0]
    V = mem.vote(trained.network_.hidden(Xtr[:40]), 1)       # its nearest row is itself
    np.testing.assert_array_equal((V.toarray() > 0), Ytr[:40].toarray() > 0)


def test_blended_top_k_is_the_top_k_of_the_blended_probabilities(tiny):
    Xtr, Ytr, Xte, _ = tiny
    for loss in ("softmax", "sigmoid"):
        m = slide.SlideClassifier(epochs=2, loss=loss, neighbours=7, neighbour_weight=0.6,
                                  **SMALL).fit(Xtr, Ytr)
        P = m.predict_proba(Xte)
        top = m.predict_topk(Xte, k=6)
        ids, scores = m.predict_topk_scored(Xte, k=6)
        np.testing.assert_array_equal(ids, top)
        np.testing.assert_allclose(scores, np.take_along_axis(P, top, axis=1), rtol=1e-4,
                                   atol=1e-7)
        # no label outside the top-k scores higher than the k-th
        kth = np.take_along_axis(P, top[:, -1:], axis=1)
        outside = P.copy()
        np.put_along_axis(outside, top, -np.inf, axis=1)
        assert np.all(outside.max(axis=1) <= kth[:, 0] + 1e-6)
        # the blend is the documented mixture of the network and the vote
        Pn = m.predict_proba(Xte, neighbours=0)
        V = m.rank_.memory.vote(m.network_.hidden(Xte), 7).toarray()
        np.testing.assert_allclose(P, 0.4 * Pn + 0.6 * V, atol=1e-5)


def test_neighbours_zero_or_weight_zero_is_the_network_alone(tiny, trained):
    _, _, Xte, _ = tiny
    alone = trained.network_.predict_topk_exact(Xte, 5)
    with_vote = trained.predict_topk(Xte, k=5)
    assert not np.array_equal(alone, with_vote)     # the vote changes some rankings
    np.testing.assert_array_equal(trained.predict_topk(Xte, k=5, neighbours=0), alone)
    logits_top = trained.predict_topk_scored(Xte, k=5, neighbours=0)
    np.testing.assert_array_equal(logits_top[0], alone)
    np.testing.assert_allclose(logits_top[1], np.take_along_axis(
        trained.predict_scores(Xte), alone, axis=1), rtol=1e-5, atol=1e-5)
    # the vote's settings are fixed at fit: set_params afterwards changes no prediction
    trained.set_params(neighbours=0)
    try:
        np.testing.assert_array_equal(trained.predict_topk(Xte, k=5), with_vote)
    finally:
        trained.set_params(neighbours=20)
    m = slide.SlideClassifier(epochs=3, neighbour_weight=0.0, **SMALL).fit(*tiny[:2])
    np.testing.assert_array_equal(m.predict_topk(Xte, k=1), alone[:, :1])


def test_the_vote_helps_where_labels_follow_the_neighbours():
    # rows drawn around 30 cluster centres, each cluster with its own 2 labels; the network
    # is given one batch only (it has learned almost nothing): the vote of the nearest
    # training rows still finds the cluster
    rng = np.random.default_rng(0)
    centres = rng.random((30, 200)) < 0.05
    lab = rng.integers(0, 60, size=(30, 2))

    def draw(n):
        c = rng.integers(0, 30, n)
        X = (centres[c] | (rng.random((n, 200)) < 0.01)).astype(np.float32)
        Y = np.zeros((n, 60), np.float32)
        Y[np.arange(n), lab[c, 0]] = Y[np.arange(n), lab[c, 1]] = 1
        return sp.csr_matrix(X), sp.csr_matrix(Y)

    Xtr, Ytr = draw(600)
    Xte, Yte = draw(200)
    m = slide.SlideClassifier(hidden_sizes=(64,), epochs=1, batch_size=512, n_threads=1,
                              random_state=0).fit(Xtr, Ytr)
    hit = lambda top: float(np.mean(Yte.toarray()[np.arange(200), top[:, 0]]))  # noqa: E731
    with_vote = hit(m.predict_topk(Xte, k=1))
    alone = hit(m.predict_topk(Xte, k=1, neighbours=0))
    assert with_vote >= 0.9 and with_vote > alone + 0.2, (with_vote, alone)


def test_fit_builds_partial_fit_drops_fit_neighbours_rebuilds(tiny):
    Xtr, Ytr, Xte, _ = tiny
    seen = []
    m = slide.SlideClassifier(epochs=1, **SMALL)
    m.fit(Xtr, Ytr, callback=lambda model, info: seen.append(info["train_seconds"]))
    assert m.rank_.memory is not None
    assert m.train_seconds_ > seen[-1]               # the build counts as training time
    m.partial_fit(Xtr, Ytr)
    assert m.rank_.memory is None                 # built from weights that moved
    np.testing.assert_array_equal(m.predict_topk(Xte, k=3), m.network_.predict_topk_exact(Xte, 3))
    m.fit_neighbours(Xtr[:100], Ytr[:100])
    assert m.rank_.memory.n_rows == 100
    off = slide.SlideClassifier(epochs=1, neighbours=0, **SMALL).fit(Xtr, Ytr)
    assert off.rank_.memory is None


def test_a_fit_stopped_by_its_callback_builds_no_memory(tiny):
    Xtr, Ytr, _, _ = tiny
    m = slide.SlideClassifier(epochs=2, **SMALL)
    m.fit(Xtr, Ytr, callback=lambda model, info: info["batch"] == 3)
    assert m.stopped_ and m.rank_.memory is None
    m.fit(Xtr, Ytr, resume=True)
    assert not m.stopped_ and m.rank_.memory is not None


def test_checkpoint_keeps_the_memory(tiny, trained, tmp_path):
    _, _, Xte, _ = tiny
    trained.save(tmp_path / "m.slide")
    loaded = slide.load(tmp_path / "m.slide")
    np.testing.assert_array_equal(loaded.rank_.memory.emb, trained.rank_.memory.emb)
    np.testing.assert_array_equal(loaded.predict_topk(Xte, k=5), trained.predict_topk(Xte, k=5))


def test_checkpoint_with_a_broken_memory_is_refused(tiny, trained, tmp_path, rewrite_checkpoint):
    trained.save(tmp_path / "m.slide")
    meta, arrays = checkpoint.read(tmp_path / "m.slide")

    write = rewrite_checkpoint
    with pytest.raises(checkpoint.CheckpointError, match="neighbour memory arrays"):
        slide.load(write("a.slide", dict(meta, neighbours=None), arrays))
    ids = arrays["nbr_label_ids"].copy()
    ids[0] = 10_000
    with pytest.raises(checkpoint.CheckpointError, match="label ids outside"):
        slide.load(write("b.slide", meta, dict(arrays, nbr_label_ids=ids)))
    emb = np.zeros((arrays["nbr_emb"].shape[0], 7), np.float32)
    with pytest.raises(checkpoint.CheckpointError, match="does not fit the network"):
        slide.load(write("c.slide", meta, dict(arrays, nbr_emb=emb)))
    emb = arrays["nbr_emb"].copy()
    emb[3, 1] = np.nan
    with pytest.raises(checkpoint.CheckpointError, match="non-finite"):
        slide.load(write("d.slide", meta, dict(arrays, nbr_emb=emb)))


def test_ensemble_averages_the_members_blends(tiny):
    Xtr, Ytr, Xte, _ = tiny
    ens = slide.SlideEnsemble(slide.SlideClassifier(epochs=1, **SMALL), n_models=2,
                              random_state=0, fused=False).fit(Xtr, Ytr)
    assert all(m.rank_.memory is not None for m in ens.members_)
    want = (ens.members_[0].predict_proba(Xte) + ens.members_[1].predict_proba(Xte)) / 2
    np.testing.assert_allclose(ens.predict_proba(Xte), want, atol=1e-6)


SHARDED = dict(sampler="vanilla", K=3, L=10, range_pow=9, bucket_size=32, sampler_budget=30,
               min_active=40, shared_negatives=16, batch_size=32, learning_rate=1e-2,
               lr_schedule="constant", n_threads=1, epochs=2)


def test_one_shard_votes_like_the_single_process(tiny):
    from slide.distributed import ShardedSlideClassifier
    Xtr, Ytr, Xte, _ = tiny
    single = slide.SlideClassifier(random_state=3, **SHARDED).fit(Xtr, Ytr)
    sh = ShardedSlideClassifier(n_shards=1, backend="local", random_state=3, **SHARDED)
    sh.fit(Xtr, Ytr)
    try:
        assert sh.rank_.memory is not None and sh.get_params()["neighbours"] == 20
        np.testing.assert_allclose(sh.rank_.memory.emb, single.rank_.memory.emb, atol=1e-4)
        np.testing.assert_array_equal(sh.predict_topk(Xte, 5), single.predict_topk(Xte, 5))
    finally:
        sh.close()


def test_sharded_blend_is_the_top_k_of_its_probabilities(tiny, tmp_path):
    from slide.distributed import ShardedSlideClassifier
    from slide.distributed.convert import to_single
    Xtr, Ytr, Xte, _ = tiny
    sh = ShardedSlideClassifier(n_shards=3, backend="local", random_state=0, **SHARDED)
    sh.fit(Xtr, Ytr)
    try:
        P = sh.predict_proba(Xte)
        ids, scores = sh.predict_topk_scored(Xte, k=5)
        np.testing.assert_array_equal(ids, sh.predict_topk(Xte, k=5))
        np.testing.assert_allclose(scores, np.take_along_axis(P, ids, axis=1), rtol=1e-4,
                                   atol=1e-7)
        outside = P.copy()
        np.put_along_axis(outside, ids, -np.inf, axis=1)
        assert np.all(outside.max(axis=1) <= scores[:, -1] + 1e-6)
        # the driver's checkpoint keeps the memory; the single-process copy keeps it too
        sh.save(tmp_path / "ck")
        loaded = slide.load(tmp_path / "ck")
        try:
            np.testing.assert_array_equal(loaded.rank_.memory.emb, sh.rank_.memory.emb)
            np.testing.assert_array_equal(loaded.predict_topk(Xte, 5), ids)
        finally:
            loaded.close()
        single = to_single(sh)
        assert single.rank_.memory is sh.rank_.memory
        np.testing.assert_array_equal(single.predict_topk(Xte, 5), ids)
        # more training drops it
        sh.partial_fit(Xtr, Ytr)
        assert sh.rank_.memory is None
    finally:
        sh.close()


def test_bad_settings_are_refused(tiny):
    Xtr, Ytr, _, _ = tiny
    for bad in (dict(neighbours=-1), dict(neighbours=2.5), dict(neighbour_weight=1.5),
                dict(neighbour_weight=-0.1)):
        with pytest.raises(ValueError, match="neighbour"):
            slide.SlideClassifier(epochs=1, **bad, **SMALL).fit(Xtr, Ytr)
    m = slide.SlideClassifier(epochs=1, **SMALL).fit(Xtr, Ytr)
    for bad in (-1, 2.5, True):         # a prediction's own vote size
        with pytest.raises(ValueError, match="neighbours"):
            m.predict_topk(Xtr[:3], neighbours=bad)
    before = m.predict_topk(Xtr[:3])
    m.set_params(neighbours=2.5)        # after fit: not read by predictions; refit refuses it
    np.testing.assert_array_equal(m.predict_topk(Xtr[:3]), before)
    with pytest.raises(ValueError, match="neighbours"):
        m.fit_neighbours(Xtr, Ytr)
    with pytest.raises(ValueError, match="hidden rows"):
        NeighbourMemory.build(np.zeros((3, 2), np.float32), sp.csr_matrix((4, 5)))


def test_nearest_in_chunks_of_memory_rows_is_nearest_at_once(monkeypatch):
    import slide.rank.vote as nb
    rng = np.random.default_rng(5)
    # small integers: ties among the similarities, broken the same way in any chunking
    H = rng.integers(-2, 3, size=(300, 6)).astype(np.float32)
    Y = sp.csr_matrix((rng.random((300, 9)) < 0.3).astype(np.float32))
    memory = NeighbourMemory.build(H, Y)
    Q = rng.integers(-2, 3, size=(40, 6)).astype(np.float32)
    exclude = rng.choice(300, 60, replace=False)
    whole = [memory.nearest(Q, 7), memory.nearest(Q, 7, exclude)]
    monkeypatch.setattr(nb, "_BLOCK_ENTRIES", 300 * 8)       # 8 queries a block ...
    monkeypatch.setattr(nb, "_CHUNK_ENTRIES", 8 * 37)        # ... 37 memory rows a chunk
    for (ids, sims), exc in zip(whole, (None, exclude)):
        got_ids, got_sims = memory.nearest(Q, 7, exc)
        np.testing.assert_array_equal(got_ids, ids)
        np.testing.assert_array_equal(got_sims, sims)
        if exc is not None:
            assert not np.isin(got_ids, exc).any()
