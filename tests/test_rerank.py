"""The re-ranker of the neighbour vote's candidates (slide.rank.rerank): the held-out split, the
label centroids, the candidates' features against a row-by-row reference, the fitted model's
predictions, checkpoints, and what partial_fit, fit_neighbours, set_params and ensembles do
with it."""
import numpy as np
import pytest
import scipy.sparse as sp

import slide
from slide import warmup
from slide.persist import checkpoint
from slide.rank import rerank
from slide.rank import words as words_mod
from slide.rank.head import HeadClassifiers
from slide.rank.linear import LabelLinear, OneVsRest
from slide.rank.vote import POWER, NeighbourMemory
from slide.rank.words import POWER as WORD_POWER, WordIndex

SMALL = dict(hidden_sizes=(32,), batch_size=64, learning_rate=1e-2, n_threads=1,
             random_state=0)


def keyword_data(n, seed, n_labels=120, n_features=600, noise=0.02):
    """Rows whose words are their two labels' keywords (6 of each label's 10, drawn afresh per
    row) plus random words: the input carries the labels, so the cosine to a label's centroid
    is strong evidence."""
    rng = np.random.default_rng(seed)
    keys = np.random.default_rng(99).integers(0, n_features, size=(n_labels, 10))
    pop = 1.0 / np.arange(1, n_labels + 1)
    pop /= pop.sum()
    X = np.zeros((n, n_features), np.float32)
    Y = np.zeros((n, n_labels), np.float32)
    for i in range(n):
        labs = rng.choice(n_labels, 2, replace=False, p=pop)
        Y[i, labs] = 1
        for j in labs:
            X[i, rng.choice(keys[j], 6, replace=False)] += 1
        X[i, rng.random(n_features) < noise] += 1
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    return sp.csr_matrix(X), sp.csr_matrix(Y)


@pytest.fixture(scope="module")
def data():
    Xtr, Ytr = keyword_data(2400, 0)
    Xte, Yte = keyword_data(400, 1)
    return Xtr, Ytr, Xte, Yte


@pytest.fixture(scope="module")
def model(data):
    Xtr, Ytr, _, _ = data
    return slide.SlideClassifier(epochs=2, **SMALL).fit(Xtr, Ytr)


def p_at_1(top, Y):
    return float(np.mean(np.asarray(Y[np.arange(Y.shape[0]), top[:, 0]]).ravel()))


def test_holdout_rows_are_a_seeded_disjoint_split():
    fit_rows, held = rerank.holdout_rows(3000, seed=5)
    assert held.shape[0] == 300 and fit_rows.shape[0] == 2700
    assert np.array_equal(np.sort(np.concatenate([fit_rows, held])), np.arange(3000))
    again = rerank.holdout_rows(3000, seed=5)
    assert np.array_equal(again[1], held)
    assert not np.array_equal(rerank.holdout_rows(3000, seed=6)[1], held)
    assert rerank.holdout_rows(1999, seed=5) is None          # 199 held-out rows: too few
    assert rerank.holdout_rows(100, seed=5, min_rows=10) is not None


def test_label_centroids_keep_the_largest_entries_over_the_full_norm():
    rng = np.random.default_rng(0)
    X = sp.random(40, 30, density=0.3, random_state=1, format="csr", dtype=np.float32)
    Yd = (rng.random((40, 7)) < 0.3).astype(np.float32)
    Yd[:, 6] = 0                                    # a label without rows
    Y = sp.csr_matrix(Yd)
    ones = X.copy()
    ones.data[:] = 1.0                              # integer sums: many ties at the cut
    for X, m in ((X, 3), (X, 30), (ones, 3), (ones, 5)):
        ptr, ids, vals = rerank.label_centroids(X, Y, m)
        S = (Y.T @ X).toarray()
        for j in range(7):
            row = np.zeros(30)
            row[ids[ptr[j]:ptr[j + 1]]] = vals[ptr[j]:ptr[j + 1]]
            assert np.all(np.diff(ids[ptr[j]:ptr[j + 1]]) > 0)      # sorted ids
            norm = np.linalg.norm(S[j])
            if norm == 0:
                assert ptr[j + 1] == ptr[j]
                continue
            keep = np.argsort(-S[j], kind="stable")[:min(m, np.count_nonzero(S[j]))]
            expect = np.zeros(30)
            expect[keep] = S[j, keep] / norm
            np.testing.assert_allclose(row, expect, rtol=1e-5, atol=1e-7)


def test_centroids_and_counts_of_a_subset_of_the_rows_are_those_of_the_subset():
    rng = np.random.default_rng(3)
    X = sp.random(60, 25, density=0.3, random_state=2, format="csr", dtype=np.float32)
    Y = sp.csr_matrix((rng.random((60, 9)) < 0.3).astype(np.float32))
    rows = np.sort(rng.choice(60, 35, replace=False))
    for got, expect in zip(rerank.label_centroids(X, Y, 4, rows=rows),
                           rerank.label_centroids(X[rows], Y[rows], 4)):
        np.testing.assert_array_equal(got, expect)
    np.testing.assert_array_equal(rerank.label_counts(Y, rows),
                                  np.asarray(Y[rows].sum(axis=0)).ravel().astype(np.int64))


_M64 = (1 << 64) - 1


def _reference_linear(linear, x, j):
    """The linear score of label j for row x, the hash written out with Python integers."""
    xd = x.toarray().ravel()
    norm = np.linalg.norm(xd)
    s = 0.0
    for f in np.flatnonzero(xd):
        h = ((int(f) * 0x9E3779B97F4A7C15) & _M64) ^ ((int(j) * 0xC2B2AE3D27D4EB4F) & _M64)
        h ^= h >> 29
        s += xd[f] * linear.weights[h & (linear.weights.shape[0] - 1)]
    return linear.bias[j] + (s / norm if norm > 0 else 0.0)


def _reference_head(head, x, j):
    """The head score of label j for row x: its one-vs-rest classifier's, 0 outside the head."""
    if j not in set(head.labels.tolist()):
        return 0.0
    col = int(np.searchsorted(head.labels, j))
    xd = x.toarray().ravel()
    kept = [f for f in np.flatnonzero(xd) if head.ovr.slot[f] >= 0]
    z = sum(xd[f] * head.ovr.weights[head.ovr.slot[f], col] for f in kept)
    return head.ovr.bias[col] + z / np.linalg.norm(xd)


def _reference_features(net, x, h, memory, k, centroids, n_top, sigmoid, linear=None,
                        head=None, word_nb=None):
    """One row's candidates and features, written out with dicts (the probe's form);
    ``word_nb``: the row's word neighbours (ids, similarities; tested in test_words.py)."""
    Wo, bo = net.output_view()
    z = Wo.astype(np.float64) @ h.astype(np.float64) + bo
    lse = np.log(np.exp(z - z.max()).sum()) + z.max()
    top = np.argsort(-z, kind="stable")[:n_top]
    e = memory.emb.astype(np.float64)
    s = e @ (h / np.linalg.norm(h))
    near = np.argsort(-s, kind="stable")[:k]
    w = np.maximum(s[near], 0) ** POWER
    w = w / (w.sum() or 1.0)
    cand = {}
    for t, j in enumerate(top):
        cand[int(j)] = dict(rank=t)
    for t, i in enumerate(near):
        for j in memory.label_ids[memory.label_indptr[i]:memory.label_indptr[i + 1]]:
            d = cand.setdefault(int(j), {})
            d["vote"] = d.get("vote", 0) + w[t]
            d["count"] = d.get("count", 0) + 1
            d["best"] = max(d.get("best", 0.0), s[near[t]])
            d["first"] = min(d.get("first", k), t)
    if word_nb is not None:
        wn, ws = word_nb
        ww = np.maximum(ws[wn >= 0], 0.0).astype(np.float64) ** WORD_POWER
        ww = ww / (ww.sum() or 1.0)
        for t, i in enumerate(wn[wn >= 0]):
            for j in memory.label_ids[memory.label_indptr[i]:memory.label_indptr[i + 1]]:
                if t >= words_mod.NEW_ROWS and int(j) not in cand:
                    continue        # only the nearest NEW_ROWS rows' labels join
                d = cand.setdefault(int(j), {})
                d["word"] = d.get("word", 0) + ww[t]
    counts = np.bincount(memory.label_ids, minlength=memory.n_labels)
    ptr, ids, vals = centroids
    xd = x.toarray().ravel()
    out = {}
    for j, d in cand.items():
        lp = -np.log1p(np.exp(-z[j])) if sigmoid else z[j] - lse
        c = np.zeros_like(xd)
        c[ids[ptr[j]:ptr[j + 1]]] = vals[ptr[j]:ptr[j + 1]]
        out[j] = [lp, np.exp(lp), d.get("vote", 0), d.get("count", 0) / k, d.get("best", 0),
                  d.get("first", k) / k, min(d.get("rank", rerank.N_TOP), rerank.N_TOP)
                  / rerank.N_TOP, np.log1p(counts[j]), s[near[0]],
                  xd @ c / np.linalg.norm(xd),
                  0.0 if linear is None else _reference_linear(linear, x, j),
                  0.0 if head is None else _reference_head(head, x, j), d.get("word", 0.0)]
    return out


@pytest.mark.parametrize("loss", ["softmax", "sigmoid"])
def test_candidate_features_match_a_row_by_row_reference(tiny, loss, monkeypatch):
    Xtr, Ytr, Xte, _ = tiny
    m = slide.SlideClassifier(epochs=1, neighbours=0, loss=loss, **SMALL).fit(Xtr, Ytr)
    net = m.network_
    memory = NeighbourMemory.build(net.hidden(Xtr), Ytr)
    cen = rerank.label_centroids(Xtr, Ytr, 12)
    X = sp.csr_matrix(Xte[:25] * 3.0, dtype=np.float32)     # rows not of unit norm
    H = net.hidden(X)
    k, n_top = 7, 12
    rng = np.random.default_rng(1)
    linear = LabelLinear(rng.normal(size=1 << 10).astype(np.float32),
                         rng.normal(size=Ytr.shape[1]).astype(np.float32))
    # every other label in the head; a third of the features without a weight row
    labels = np.arange(0, Ytr.shape[1], 2, dtype=np.int64)
    kept = np.arange(Xtr.shape[1]) % 3 != 0
    slot = np.full(Xtr.shape[1], -1, np.int32)
    slot[kept] = np.arange(kept.sum())
    weights = rng.normal(size=(int(kept.sum()), labels.shape[0])).astype(np.float32)
    head = HeadClassifiers(labels, OneVsRest(weights, slot, rng.normal(size=labels.shape[0])),
                           Ytr.shape[1])
    words = WordIndex.build(Xtr)
    near, sims = words.nearest(X)
    for lin, hd, wd, n_new in ((None, None, None, 0), (linear, None, None, 0),
                               (linear, head, None, 0), (None, None, words, 20),
                               (linear, head, words, 3)):
        monkeypatch.setattr(words_mod, "NEW_ROWS", n_new)
        ptr, counts, ids, F = rerank.features(net.output_layer(), X, H, memory, k, cen, n_top,
                                              linear=lin, head=hd, words=wd)
        for r in range(X.shape[0]):
            ref = _reference_features(net, X[r], H[r], memory, k, cen, n_top,
                                      loss == "sigmoid", lin, hd,
                                      None if wd is None else (near[r], sims[r]))
            got = {int(j): F[ptr[r] + u]
                   for u, j in enumerate(ids[ptr[r]:ptr[r] + counts[r]])}
            assert set(got) == set(ref)
            for j in ref:
                np.testing.assert_allclose(got[j], ref[j], rtol=2e-4, atol=2e-5)


def test_expand_is_the_features_then_their_pairwise_products():
    F = np.arange(1.0, 7.0).reshape(2, 3)
    E = rerank.expand(F)
    assert E.shape == (2, 3 + 6)
    np.testing.assert_array_equal(E[1], [4, 5, 6, 16, 20, 24, 25, 30, 36])
    assert rerank.expand(np.zeros((1, rerank.N_BASE))).shape[1] == rerank.N_TERMS


@pytest.mark.parametrize("d", sorted(set(rerank.FORMAT_FEATURES.values())))
def test_the_fused_scores_are_the_expanded_terms_times_the_weights(d):
    rng = np.random.default_rng(d)
    F = rng.normal(size=(301, rerank.N_BASE))    # a re-ranker reads the first d (its format's)
    mean, scale = rng.normal(size=d), rng.random(d) + 0.5
    coef = rng.normal(size=rerank.n_terms(d))
    expect = rerank.expand((F[:, :d] - mean) / scale) @ coef - 0.7
    np.testing.assert_allclose(rerank.expanded_scores(F[:, :d], mean, scale, coef, -0.7),
                               expect, rtol=1e-12, atol=1e-12)
    assert rerank.expanded_scores(F[:0, :d], mean, scale, coef, 1.0).shape == (0,)


def test_fit_trains_the_network_on_the_rest_and_ranks_by_the_reranker(data, model):
    Xtr, Ytr, Xte, Yte = data
    fit_rows, held = rerank.holdout_rows(Xtr.shape[0], model.seed_, n_labels=Ytr.shape[1])
    assert model.samples_ == 2 * fit_rows.shape[0]          # two epochs of the network's rows
    net, rank = model.network_, model.rank_
    assert rank.reranker is not None and rank.memory.n_rows == Xtr.shape[0]
    top = model.predict_topk(Xte, k=5)
    ids, prob = model.predict_topk_scored(Xte, k=5)
    np.testing.assert_array_equal(ids, top)
    assert np.all((prob > 0) & (prob <= 1)) and np.all(np.diff(prob, axis=1) <= 0)
    # the order is the re-ranker's decision values over each row's candidates
    ptr, counts, cid, F = rerank.features(net.output_layer(), Xte, net.hidden(Xte), rank.memory,
                                          rank.reranker.k_nn, rank.reranker.centroids, 10,
                                          linear=rank.reranker.linear,
                                          words=rank.reranker.words)
    assert rank.reranker.linear is not None and np.any(F[:, rerank.LINEAR_SCORE] != 0)
    assert rank.reranker.words is not None and np.any(F[:, rerank.WORD_VOTE] != 0)
    s = rank.reranker.score(F)
    for r in range(0, Xte.shape[0], 37):
        c = cid[ptr[r]:ptr[r] + counts[r]]
        best = c[np.argsort(-s[ptr[r]:ptr[r] + counts[r]], kind="stable")[:5]]
        np.testing.assert_array_equal(top[r], best)
    # the probabilities and rerank=False are the fixed blend
    blend = model.predict_topk(Xte, k=5, rerank=False)
    P = model.predict_proba(Xte)
    np.testing.assert_array_equal(blend, np.argsort(-P, axis=1, kind="stable")[:, :5])
    assert not np.array_equal(blend, top)
    # fixed at fit: set_params(rerank=False) afterwards changes nothing
    try:
        np.testing.assert_array_equal(model.set_params(rerank=False).predict_topk(Xte, k=5),
                                      top)
    finally:
        model.set_params(rerank=True)


def test_a_rows_first_labels_do_not_depend_on_k(data, model):
    """The re-ranker ranks the candidates it was fitted on whatever k (a deeper network list
    added candidates it never saw, and they displaced better ones); a row short of k
    candidates continues with the network's next labels at probability 0."""
    _, Ytr, Xte, _ = data
    top5 = model.predict_topk(Xte, k=5)
    n_labels = Ytr.shape[1]
    for k in (30, n_labels):
        ids, prob = model.predict_topk_scored(Xte, k=k)
        np.testing.assert_array_equal(ids[:, :5], top5)
        assert np.all(np.diff(prob, axis=1) <= 0)
    # k = every label: each row lists each label once, the unranked ones at 0, in the
    # network's order (its logits, best first)
    assert (np.sort(ids, axis=1) == np.arange(n_labels)).all()
    net, rank = model.network_, model.rank_
    ptr, counts, cid, _ = rerank.features(net.output_layer(), Xte, net.hidden(Xte), rank.memory,
                                          rank.reranker.k_nn, rank.reranker.centroids, 10,
                                          linear=rank.reranker.linear,
                                          words=rank.reranker.words)
    assert np.array_equal((prob > 0).sum(axis=1), counts)
    Z = net.output_layer().logits(net.hidden(Xte))
    for r in range(0, Xte.shape[0], 53):
        rest = ids[r, counts[r]:]
        assert set(rest.tolist()).isdisjoint(cid[ptr[r]:ptr[r] + counts[r]].tolist())
        assert np.all(np.diff(Z[r, rest]) <= 0) and not prob[r, counts[r]:].any()


def test_the_reranker_uses_the_words_the_network_has_not_learned(data):
    # one epoch of 5 batches: the network and its hidden-layer vote know little yet, the
    # rows' words name their labels; the re-ranker learns to use the centroid cosine
    Xtr, Ytr, Xte, Yte = data
    m = slide.SlideClassifier(**dict(SMALL, epochs=1, batch_size=512)).fit(Xtr, Ytr)
    reranked = p_at_1(m.predict_topk(Xte, k=1), Yte)
    blend = p_at_1(m.predict_topk(Xte, k=1, rerank=False), Yte)
    assert reranked > blend + 0.1, (reranked, blend)


def test_small_sets_partial_fit_and_fit_neighbours(data, tiny):
    Xtr, Ytr, Xte, _ = data
    # 600 rows: 60 held out is too few, the whole set trains the network, the blend ranks
    small = slide.SlideClassifier(epochs=1, **SMALL).fit(*tiny[:2])
    assert small.rank_.reranker is None and small.samples_ == tiny[0].shape[0]
    off = slide.SlideClassifier(epochs=1, rerank=False, **SMALL).fit(Xtr, Ytr)
    assert off.rank_.reranker is None and off.samples_ == Xtr.shape[0]
    m = slide.SlideClassifier(epochs=1, **SMALL).fit(Xtr, Ytr)
    before = m.rank_.reranker
    m.fit_neighbours(Xtr[:1000], Ytr[:1000])        # a new memory; the re-ranker stays
    assert m.rank_.reranker is before and m.rank_.memory.n_rows == 1000
    m.partial_fit(Xtr, Ytr)                          # the weights change: both go
    assert m.rank_.reranker is None and m.rank_.memory is None


def test_ensemble_members_rerank_and_their_ranked_lists_are_fused(data, tmp_path, monkeypatch):
    Xtr, Ytr, Xte, _ = data
    ens = slide.SlideEnsemble(slide.SlideClassifier(epochs=1, **SMALL), n_models=2,
                              fused=False).fit(Xtr, Ytr)
    assert all(m.rerank_ and m.rank_.reranker is not None for m in ens.members_)
    monkeypatch.setattr(slide.ensemble, "_FUSE_ROWS", 150)          # three blocks of rows
    top = ens.predict_topk(Xte, k=5)
    depth = slide.ensemble.FUSE_DEPTH
    lists = [m.predict_topk_scored(Xte, k=depth) for m in ens.members_]
    np.testing.assert_array_equal(top, slide.ensemble.fuse_ranked(lists, 5, Ytr.shape[1]))
    assert not np.array_equal(top, ens.members_[0].predict_topk(Xte, k=5))
    # the scores that ranked them: the geometric mean of the members' floored probabilities
    ids, scores = ens.predict_topk_scored(Xte, k=5)
    np.testing.assert_array_equal(ids, top)
    assert (np.diff(scores, axis=1) <= 0).all()
    floor = slide.ensemble.FUSE_FLOOR
    for r in (0, 7, 301):
        for j, got in zip(ids[r], scores[r]):
            p = [dict(zip(li[r].tolist(), lp[r].tolist())).get(int(j), floor)
                 for li, lp in lists]
            assert got == pytest.approx(np.exp(np.mean(np.log(np.maximum(p, floor)))))
    ens.save(tmp_path / "e.slide")
    np.testing.assert_array_equal(slide.load(tmp_path / "e.slide").predict_topk(Xte, k=5), top)
    # members without a re-ranker: the mean of their probabilities, as before
    for m in ens.members_:
        m.rerank_ = False
    p = ens.predict_proba(Xte)
    mean_top = ens.predict_topk(Xte, k=1)[:, 0]
    np.testing.assert_array_equal(p[np.arange(Xte.shape[0]), mean_top], p.max(axis=1))
    ids, scores = ens.predict_topk_scored(Xte, k=3)
    np.testing.assert_array_equal(ids, ens.predict_topk(Xte, k=3))
    np.testing.assert_allclose(scores, np.take_along_axis(p, ids, axis=1), rtol=1e-6)


def test_fused_ranking_sums_log_probabilities_with_a_floor_for_unlisted_labels():
    floor = slide.ensemble.FUSE_FLOOR
    a = (np.array([[3, 1, 2], [0, 4, -1]]), np.array([[0.5, 0.3, 0.1], [0.6, 0.2, 0.0]]))
    b = (np.array([[1, 3, 0], [4, 2, 0]]), np.array([[0.4, 0.2, 1e-9], [0.5, 0.3, 0.1]]))
    got = slide.ensemble.fuse_ranked([a, b], 4, 5)
    for r in range(2):
        score = {}
        for ids, p in (a, b):
            listed = {int(j): np.log(max(v, floor)) for j, v in zip(ids[r], p[r]) if j >= 0}
            for j in range(5):
                score[j] = score.get(j, 0.0) + listed.get(j, np.log(floor))
        listed_any = {int(j) for ids, _ in (a, b) for j in ids[r] if j >= 0}
        expect = sorted(listed_any, key=lambda j: (-score[j], j))[:4]
        expect += [-1] * (4 - len(expect))
        assert got[r].tolist() == expect, (r, got[r], expect)
    # by hand: 0.3 x 0.4 > 0.5 x 0.2 > 0.1 x floor > 1e-9 (floored) x floor; row 1 lists 3
    assert got.tolist() == [[1, 3, 2, 0], [4, 0, 2, -1]]


def test_checkpoint_keeps_the_reranker(data, model, tmp_path):
    _, _, Xte, _ = data
    model.save(tmp_path / "m.slide")
    loaded = slide.load(tmp_path / "m.slide")
    a, b = loaded.rank_.reranker, model.rank_.reranker
    np.testing.assert_array_equal(a.coef, b.coef)
    for x, y in zip(a.centroids, b.centroids):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(loaded.predict_topk(Xte, k=5), model.predict_topk(Xte, k=5))


def test_checkpoint_with_a_broken_reranker_is_refused(model, tmp_path, rewrite_checkpoint):
    model.save(tmp_path / "m.slide")
    meta, arrays = checkpoint.read(tmp_path / "m.slide")

    write = rewrite_checkpoint
    with pytest.raises(checkpoint.CheckpointError, match="re-ranker arrays"):
        slide.load(write("a.slide", dict(meta, reranker=None), arrays))
    # one-vs-rest classifiers, no head, the word vote: 12 features, 90 terms
    with pytest.raises(checkpoint.CheckpointError, match="re-ranker: coef must be 90"):
        slide.load(write("b.slide", meta, dict(arrays, rr_coef=arrays["rr_coef"][:10])))
    ids = arrays["rr_cen_ids"].copy()
    ids[0] = 10_000
    with pytest.raises(checkpoint.CheckpointError, match="feature ids outside"):
        slide.load(write("c.slide", meta, dict(arrays, rr_cen_ids=ids)))
    coef = arrays["rr_coef"].copy()
    coef[3] = np.inf
    with pytest.raises(checkpoint.CheckpointError, match="finite"):
        slide.load(write("d.slide", meta, dict(arrays, rr_coef=coef)))
    # the one-vs-rest classifiers (the tiny set's labels are few) and the word index
    assert meta["reranker"]["format"] == 5
    rows = arrays["rr_words_rows"].copy()
    rows[0] = meta["reranker"]["words_n_rows"]
    columns = arrays["rr_columns"].copy()
    columns[-1] = rerank.HEAD_SCORE
    for broken, match in (({"rr_words_rows": rows}, "row ids outside"),
                          ({"rr_words_ptr": arrays["rr_words_ptr"][:-1]}, "feature count"),
                          ({"rr_words_vals": arrays["rr_words_vals"].astype(np.float64)},
                           "finite float32"),
                          ({"rr_columns": columns}, "ending with word_vote")):
        with pytest.raises(checkpoint.CheckpointError, match=match):
            slide.load(write("w.slide", meta, dict(arrays, **broken)))
    slot = arrays["rr_ovr_slot"].copy()
    slot[slot.argmax()] = arrays["rr_ovr_weights"].shape[0]
    for broken, match in (({"rr_lin_bias": arrays["rr_lin_bias"][:-1]}, "bias per label"),
                          ({"rr_ovr_weights": arrays["rr_ovr_weights"][:, :-1]}, "weights"),
                          ({"rr_ovr_weights": arrays["rr_ovr_weights"].astype(np.float64)},
                           "weights"),
                          ({"rr_ovr_slot": arrays["rr_ovr_slot"][:-1]}, "slots"),
                          ({"rr_ovr_slot": slot}, "slots must lie")):
        with pytest.raises(checkpoint.CheckpointError, match=match):
            slide.load(write("f.slide", meta, dict(arrays, **broken)))
    with pytest.raises(checkpoint.CheckpointError, match="format 2 does not match"):
        slide.load(write("g.slide", dict(meta, reranker=dict(meta["reranker"], format=2)),
                         arrays))
    no_memory = {k: v for k, v in arrays.items() if not k.startswith("nbr_")}
    with pytest.raises(checkpoint.CheckpointError, match="without the neighbour memory"):
        slide.load(write("e.slide", dict(meta, neighbours=None), no_memory))


@pytest.fixture(scope="module")
def hashed_model(data):
    """The defaults' model with the hashed hard-negative classifiers (one-vs-rest made
    unaffordable) and without the word vote: a format-2 re-ranker."""
    from slide.rank import linear as label_linear
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(label_linear, "MAX_OVR_WORK", 0)
        mp.setattr(words_mod, "K", 0)
        return slide.SlideClassifier(epochs=2, **SMALL).fit(*data[:2])


@pytest.fixture(scope="module")
def ovr_model(data):
    """The defaults' model without the word vote: a format-3 re-ranker."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(words_mod, "K", 0)
        return slide.SlideClassifier(epochs=2, **SMALL).fit(*data[:2])


def test_checkpoint_keeps_the_hashed_classifiers_and_refuses_broken_ones(
        data, hashed_model, tmp_path, rewrite_checkpoint):
    _, _, Xte, _ = data
    assert isinstance(hashed_model.rank_.reranker.linear, LabelLinear)
    hashed_model.save(tmp_path / "m.slide")
    loaded = slide.load(tmp_path / "m.slide")
    np.testing.assert_array_equal(loaded.rank_.reranker.linear.weights,
                                  hashed_model.rank_.reranker.linear.weights)
    np.testing.assert_array_equal(loaded.predict_topk(Xte, k=5),
                                  hashed_model.predict_topk(Xte, k=5))
    meta, arrays = checkpoint.read(tmp_path / "m.slide")
    assert meta["reranker"]["format"] == 2
    for broken in ({"rr_lin_weights": arrays["rr_lin_weights"][:-1]},
                   {"rr_lin_weights": arrays["rr_lin_weights"].astype(np.float64)}):
        with pytest.raises(checkpoint.CheckpointError, match="power-of-two table"):
            slide.load(rewrite_checkpoint("f.slide", meta, dict(arrays, **broken)))
    with pytest.raises(checkpoint.CheckpointError, match="format 3 does not match"):
        slide.load(rewrite_checkpoint(
            "g.slide", dict(meta, reranker=dict(meta["reranker"], format=3)), arrays))


def test_a_format_1_reranker_loads_and_ranks_without_the_linear_score(
        data, ovr_model, tmp_path, rewrite_checkpoint):
    # format 1 (written before the linear classifiers): ten features, 65 weights
    _, _, Xte, _ = data
    model = ovr_model
    model.save(tmp_path / "m.slide")
    meta, arrays = checkpoint.read(tmp_path / "m.slide")
    n = rerank.FORMAT_FEATURES[meta["reranker"]["format"]]    # 11: linear_score last
    assert n == rerank.LINEAR_SCORE + 1
    ii, jj = np.triu_indices(n)
    pairs = np.flatnonzero((ii < n - 1) & (jj < n - 1))
    keep = np.concatenate([np.arange(n - 1), n + pairs])
    old = {k: v for k, v in arrays.items() if not k.startswith(("rr_lin_", "rr_ovr_"))}
    old.update(rr_mean=arrays["rr_mean"][:-1], rr_scale=arrays["rr_scale"][:-1],
               rr_coef=arrays["rr_coef"][keep])
    loaded = slide.load(rewrite_checkpoint("old.slide",
                                           dict(meta, reranker=dict(meta["reranker"], format=1)),
                                           old))
    rr = loaded.rank_.reranker
    assert rr.linear is None and rr.coef.shape == (65,)
    net = loaded.network_
    expect = rerank.ReRanker(arrays["rr_mean"][:-1], arrays["rr_scale"][:-1],
                             arrays["rr_coef"][keep], rr.intercept, rr.k_nn,
                             rr.centroids).topk(net.output_layer(), Xte, net.hidden(Xte),
                                                loaded.rank_.memory, 5)[0]
    np.testing.assert_array_equal(loaded.predict_topk(Xte, k=5), expect)
    assert not np.array_equal(expect, model.predict_topk(Xte, k=5))


def test_bad_rerank_setting_is_refused(data, model):
    with pytest.raises(ValueError, match="rerank"):
        slide.SlideClassifier(rerank="yes").fit(*data[:2])
    for bad in (2, 0):          # 0 too: not taken for False
        with pytest.raises(ValueError, match="rerank must be true or false, got an integer"):
            model.predict_topk(data[2], k=1, rerank=bad)


@pytest.mark.parametrize("ovr", [True, False])
def test_fit_after_the_warm_up_compiles_nothing_with_the_reranker(data, monkeypatch, ovr):
    # the warm-up's tiny set always affords one-vs-rest; the real fit may not
    from slide.rank import linear as label_linear
    monkeypatch.setattr(warmup, "_WARMED", {})
    Xtr, Ytr, Xte, Yte = data
    m = slide.SlideClassifier(**dict(SMALL, epochs=1, loss="sigmoid"))
    m._checked_params()
    assert m._warm_up() > 0.0
    before = warmup.kernel_signatures()
    for kernel in ("rank.candidates.candidate_features", "rank.linear.ovr_epoch",
                   "rank.linear.score_ovr", "rank.linear.train_epoch",
                   "rank.linear.score_candidates", "kernels.topk.strongest_entries",
                   "rank.logistic._expanded_scores", "kernels.topk.logits_into"):
        assert before.get("slide." + kernel, 0) > 0
    if not ovr:
        monkeypatch.setattr(label_linear, "MAX_OVR_WORK", 0)
    m.fit(Xtr, Ytr)
    m.predict_topk(Xte, k=5)
    assert isinstance(m.rank_.reranker.linear,
                      label_linear.OneVsRest if ovr else label_linear.LabelLinear)
    assert warmup.kernel_signatures() == before


def test_at_most_max_holdout_rows_are_held_out(monkeypatch):
    monkeypatch.setattr(rerank, "MAX_HOLDOUT_ROWS", 250)
    fit_rows, held = rerank.holdout_rows(10_000, seed=1)
    assert held.shape[0] == 250 and fit_rows.shape[0] == 9_750


def test_fewer_rows_are_held_out_where_labels_and_rows_are_many():
    # Amazon-670K's shape: 670k labels and 490k rows -> the floor of 1,000 rows (5,000 would
    # cost 40 s of exact logits and memory searches)
    fit_rows, held = rerank.holdout_rows(490_449, seed=0, n_labels=670_091)
    assert held.shape[0] == rerank.LARGE_HOLDOUT_ROWS
    assert fit_rows.shape[0] + held.shape[0] == 490_449
    # 200k labels and 100k rows: the work bound (500M / 300k = 1,666 rows)
    assert rerank.holdout_rows(100_000, seed=0, n_labels=200_000)[1].shape[0] == 1_666
    # debdeps' shape: the 10 % is below the bound
    assert rerank.holdout_rows(45_470, seed=0, n_labels=25_880)[1].shape[0] == 4_547


def test_held_out_rows_never_see_themselves_or_each_other(data, model):
    Xtr, Ytr, _, _ = data
    net = model.network_
    held = rerank.holdout_rows(Xtr.shape[0], model.seed_, n_labels=Ytr.shape[1])[1]
    near, sims = model.rank_.memory.nearest(net.hidden(Xtr[held[:50]]), 20, exclude=held)
    assert not np.isin(near, held).any() and (near >= 0).all()
    near_all, _ = model.rank_.memory.nearest(net.hidden(Xtr[held[:50]]), 1)
    np.testing.assert_array_equal(near_all[:, 0], held[:50])     # without it: itself


def test_fitting_block_by_block_is_fitting_at_once(data, model):
    Xtr, Ytr, _, _ = data
    X, Y = model._check_data(Xtr, Ytr)
    fit_rows, held = rerank.holdout_rows(X.shape[0], model.seed_, n_labels=Y.shape[1])
    net = model.network_
    whole, _ = rerank.fit_reranker(net.output_layer(), net.hidden(X), X, Y, fit_rows, held, 20,
                                   block=4096)
    blocks, memory = rerank.fit_reranker(net.output_layer(), net.hidden(X), X, Y, fit_rows,
                                         held, 20, block=50)
    # the same candidates and features up to BLAS rounding (block shapes differ), so the
    # same weights up to the solver's tolerance
    np.testing.assert_allclose(blocks.mean, whole.mean, rtol=1e-6)
    np.testing.assert_allclose(blocks.coef, whole.coef, rtol=1e-3, atol=1e-4)
    np.testing.assert_array_equal(memory.emb, model.rank_.memory.emb)


def test_newton_logistic_is_scikit_learns_logistic_regression():
    from sklearn.linear_model import LogisticRegression
    rng = np.random.default_rng(0)
    Z = rng.normal(size=(3000, 4))
    y = Z[:, 0] + 0.7 * Z[:, 1] * Z[:, 2] + rng.normal(size=3000) > 1.0
    ref = LogisticRegression(C=0.5, solver="newton-cholesky").fit(rerank.expand(Z), y)
    w = rerank.newton_logistic(Z, y, 0.5)
    np.testing.assert_allclose(w[:-1], ref.coef_.ravel(), rtol=1e-5, atol=1e-6)
    assert abs(w[-1] - ref.intercept_[0]) < 1e-5


def test_the_logistic_pass_is_the_expanded_terms_loss_gradient_and_hessian():
    from slide.rank.logistic import _logistic_pass
    rng = np.random.default_rng(1)
    Z = rng.normal(size=(777, 5))
    y = (rng.random(777) < 0.3).astype(np.float64)
    E = np.hstack([rerank.expand(Z), np.ones((777, 1))])
    w = rng.normal(size=E.shape[1]) * 0.3
    z = E @ w
    p = 1.0 / (1.0 + np.exp(-z))
    loss = np.sum(np.logaddexp(0.0, np.where(y > 0, -z, z)))
    got = _logistic_pass(Z, y, w, 0.5)
    np.testing.assert_allclose(got[0], 0.5 * loss, rtol=1e-12)
    np.testing.assert_allclose(got[1], 0.5 * E.T @ (p - y), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got[2], 0.5 * (E * (p * (1 - p))[:, None]).T @ E, rtol=1e-10,
                               atol=1e-10)


def _leak_setup():
    """300 rows, 50 features, 12 labels; the held-out rows are every fifth row and label 11
    is carried by held-out rows only (and label 10 by two of them beside its fitting rows)."""
    rng = np.random.default_rng(8)
    n, n_f, n_l = 300, 50, 12
    X = sp.random(n, n_f, density=0.15, random_state=8, format="csr", dtype=np.float32)
    X.data += 0.1
    Yd = np.zeros((n, n_l), np.float32)
    for i in range(n):
        Yd[i, rng.choice(n_l - 1, 2, replace=False)] = 1.0
    held = np.arange(0, n, 5, dtype=np.int64)
    fit_rows = np.setdiff1d(np.arange(n), held).astype(np.int64)
    Yd[held[::3], n_l - 1] = 1.0
    X, Y = sp.csr_matrix(X), sp.csr_matrix(Yd)
    X.indptr = X.indptr.astype(np.int64)
    Y.indptr = Y.indptr.astype(np.int64)
    from slide.network import Network
    net = Network((n_f, 16, n_l), [False, True], [0, 0], seed=2)
    net.W *= 4.0
    return net, X, Y, fit_rows, held


@pytest.mark.parametrize("ovr", [True, False])
def test_the_reranker_is_fitted_on_what_the_fitting_rows_alone_give(monkeypatch, ovr):
    """The held-out rows' features come from the fitting rows only: the label centroids, the
    log-counts and the linear classifiers handed to ``features`` are those of the fitting
    rows, computed here from the definitions (the centroid: the unit-L2 sum of the inputs of
    a label's fitting rows -- all 50 features kept; the count: how many fitting rows carry
    it) and, for the classifiers, a fit on the fitting rows taken out of X, Y. Label 11,
    carried by held-out rows only, has no centroid, count 0 and a classifier that never saw
    a positive."""
    import numba
    from slide.rank import linear as label_linear
    if not ovr:
        monkeypatch.setattr(label_linear, "ovr_affordable", lambda *a: False)
    net, X, Y, fit_rows, held = _leak_setup()
    seen = []
    real = rerank.features

    def spy(*args, **kw):
        seen.append((args[5], kw["log_count"], kw["linear"], kw["exclude"]))
        return real(*args, **kw)

    monkeypatch.setattr(rerank, "features", spy)
    old = numba.get_num_threads()
    numba.set_num_threads(1)        # the classifiers' HOGWILD epochs, reproducibly
    try:
        reranker, memory = rerank.fit_reranker(net.output_layer(), net.hidden(X), X, Y,
                                               fit_rows, held, 5, seed=3)
        Xf, Yf = X[fit_rows], Y[fit_rows]
        Xf.indptr, Yf.indptr = Xf.indptr.astype(np.int64), Yf.indptr.astype(np.int64)
        if ovr:
            ref = label_linear.OneVsRest.fit(Xf, Yf, np.arange(len(fit_rows)), seed=3)
        else:
            ref = label_linear.LabelLinear.fit(net.output_layer(), net.hidden(Xf), Xf, Yf,
                                               np.arange(len(fit_rows)), seed=3)
    finally:
        numba.set_num_threads(old)
    assert reranker is not None and seen
    Yfd, Xfd = Yf.toarray().astype(np.float64), Xf.toarray().astype(np.float64)
    S = Yfd.T @ Xfd                                            # [labels, features]
    norms = np.linalg.norm(S, axis=1, keepdims=True)
    cen_ref = S / np.where(norms > 0, norms, 1.0)
    counts = Yfd.sum(axis=0)
    assert counts[11] == 0 and np.asarray(Y[held].sum(axis=0)).ravel()[11] > 0
    for (c_ptr, c_ids, c_val), log_count, linear, exclude in seen:
        cen = np.zeros_like(cen_ref)
        for j in range(cen.shape[0]):
            cen[j, c_ids[c_ptr[j]:c_ptr[j + 1]]] = c_val[c_ptr[j]:c_ptr[j + 1]]
        np.testing.assert_allclose(cen, cen_ref, rtol=1e-5, atol=1e-7)
        assert c_ptr[12] == c_ptr[11]                     # label 11: no centroid
        np.testing.assert_allclose(log_count, np.log1p(counts), rtol=1e-12)
        assert type(linear) is type(ref) is (label_linear.OneVsRest if ovr
                                             else label_linear.LabelLinear)
        np.testing.assert_array_equal(linear.bias, ref.bias)
        np.testing.assert_array_equal(linear.weights, ref.weights)
        np.testing.assert_array_equal(exclude, held)
    assert reranker.linear is seen[0][2]
    # the kept re-ranker's centroids are rebuilt over every row (step 4): label 11 has one
    c_ptr = reranker.centroids[0]
    assert c_ptr[12] > c_ptr[11]


def test_the_network_of_a_reranked_fit_learns_the_label_counts_of_its_rows_only():
    """With a held-out split the network trains on the fitting rows: its shared negatives'
    draw probabilities (count + 1) / sum(count + 1) and its log-prior biases
    log((count + 1) / (n_fit + n_labels)) count the fitting rows only (computed here; a fit
    at learning rate 1e-7 leaves the biases of the first batch at their init)."""
    _, X, Y, _, _ = _leak_setup()
    m = slide.SlideClassifier(hidden_sizes=(16,), batch_size=64, epochs=1, learning_rate=1e-7,
                              lr_schedule="constant", n_threads=1, random_state=0,
                              neighbours=5, shared_negatives=8)
    m._rerank_min_holdout = 1          # 300 rows: 30 held out
    first = {}

    def grab(model, info):
        if not first:
            lay = model.network_.layout
            first["b"] = lay.bias_view(model.network_.B, lay.n_layers - 1).copy()

    m.fit(X, Y, callback=grab)
    fit_rows, held = rerank.holdout_rows(X.shape[0], m.seed_, 1, Y.shape[1])
    assert len(held) == 30 and m.samples_ == len(fit_rows) and m.rank_.reranker is not None
    counts = Y.toarray()[fit_rows].sum(axis=0).astype(np.float64)
    assert not np.array_equal(counts, Y.toarray().sum(axis=0))     # the split matters
    np.testing.assert_allclose(m.network_.negatives.q, (counts + 1.0) / (counts + 1.0).sum(),
                               rtol=1e-12)
    np.testing.assert_allclose(first["b"], np.log((counts + 1.0) / (len(fit_rows) + 12)),
                               rtol=0, atol=1e-5)


def test_select_inplace_is_numpys_partition():
    """The centroids' term cut (``topk.select_inplace``, a quickselect) picks the value
    np.partition picks, with ties, one element, and every rank."""
    from slide.kernels.topk import select_inplace
    rng = np.random.default_rng(3)
    for trial in range(400):
        n = int(rng.integers(1, 200))
        if trial % 2:
            a = rng.integers(0, int(rng.integers(1, 6)), n).astype(np.float64)   # many ties
        else:
            a = rng.standard_normal(n)
        for k in (0, n - 1, int(rng.integers(0, n))):
            assert select_inplace(a.copy(), n, k) == np.partition(a, k)[k]


@pytest.fixture(scope="module")
def head_model(data):
    """The defaults' model with the hashed classifiers and the head's one-vs-rest ones (the
    labels of at least 20 fitting rows; one-vs-rest over every label made unaffordable)."""
    from slide.rank import head, linear as label_linear
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(label_linear, "ovr_affordable", lambda *a: False)
        mp.setattr(head, "HEAD_MIN_ROWS", 20)
        return slide.SlideClassifier(epochs=2, **SMALL).fit(*data[:2])


def test_the_head_score_and_word_vote_survive_a_checkpoint_and_format_4_still_loads(
        data, head_model, tmp_path, rewrite_checkpoint):
    Xtr, Ytr, Xte, _ = data
    rr = head_model.rank_.reranker
    assert isinstance(rr.linear, LabelLinear) and rr.head is not None
    assert rr.n_features == rerank.N_BASE and rr.coef.shape == (rerank.N_TERMS,)
    counts = np.bincount(Ytr.indices, minlength=Ytr.shape[1])
    assert counts[rr.head.labels].min() >= 20 and rr.head.labels.shape[0] < Ytr.shape[1]
    rank = head_model.rank_
    ptr, n, ids, F = rerank.features(head_model.network_.output_layer(), Xte,
                                     head_model.network_.hidden(Xte), rank.memory, rr.k_nn,
                                     rr.centroids, 10, linear=rr.linear, head=rr.head)
    used = np.concatenate([np.arange(ptr[r], ptr[r] + n[r]) for r in range(n.shape[0])])
    in_head = np.isin(ids[used], rr.head.labels)
    assert in_head.any() and (~in_head).any()
    assert np.all(F[used[~in_head], rerank.HEAD_SCORE] == 0)
    assert np.any(F[used[in_head], rerank.HEAD_SCORE] != 0)
    head_model.save(tmp_path / "m.slide")
    loaded = slide.load(tmp_path / "m.slide")
    np.testing.assert_array_equal(loaded.rank_.reranker.head.labels, rr.head.labels)
    np.testing.assert_array_equal(loaded.predict_topk(Xte, k=5), head_model.predict_topk(Xte, k=5))
    meta, arrays = checkpoint.read(tmp_path / "m.slide")
    assert meta["reranker"]["format"] == 5
    np.testing.assert_array_equal(arrays["rr_columns"], np.arange(rerank.N_BASE))
    for broken, match in (({"rr_head_labels": arrays["rr_head_labels"][::-1].copy()},
                           "ascending distinct"),
                          ({"rr_head_labels": arrays["rr_head_labels"] + Ytr.shape[1]},
                           "ascending distinct"),
                          ({"rr_head_weights": arrays["rr_head_weights"][:, :-1]}, "weights")):
        with pytest.raises(checkpoint.CheckpointError, match=match):
            slide.load(rewrite_checkpoint("f.slide", meta, dict(arrays, **broken)))
    with pytest.raises(checkpoint.CheckpointError, match="format 2 does not match"):
        slide.load(rewrite_checkpoint(
            "g.slide", dict(meta, reranker=dict(meta["reranker"], format=2)), arrays))
    headless = {k: v for k, v in arrays.items() if not k.startswith("rr_head_")}
    with pytest.raises(checkpoint.CheckpointError, match="format 5: the columns do not match"):
        slide.load(rewrite_checkpoint("h.slide", meta, headless))
    # format 4 (written before the word vote): the first twelve features, no word index;
    # it ranks its candidates (none of them the words') by those
    n = rerank.N_BASE
    ii, jj = np.triu_indices(n)
    keep = np.concatenate([np.arange(n - 1), n + np.flatnonzero((ii < n - 1) & (jj < n - 1))])
    old = {k: v for k, v in arrays.items() if not k.startswith(("rr_words_", "rr_columns"))}
    old.update(rr_mean=arrays["rr_mean"][:-1], rr_scale=arrays["rr_scale"][:-1],
               rr_coef=arrays["rr_coef"][keep])
    old_meta = {k: v for k, v in meta["reranker"].items() if not k.startswith("words_")}
    loaded = slide.load(rewrite_checkpoint("old.slide", dict(meta, reranker=dict(
        old_meta, format=4)), old))
    rr4 = loaded.rank_.reranker
    assert rr4.words is None and rr4.columns.tolist() == list(range(n - 1))
    ids4 = loaded.predict_topk(Xte, k=5)
    ptr, n4, cid, F4 = rerank.features(head_model.network_.output_layer(), Xte,
                                       head_model.network_.hidden(Xte), rank.memory, rr.k_nn,
                                       rr.centroids, 10, linear=rr.linear, head=rr.head)
    s4 = rr4.score(F4)
    for r in range(0, Xte.shape[0], 41):
        c = cid[ptr[r]:ptr[r] + n4[r]]
        np.testing.assert_array_equal(
            ids4[r], c[np.argsort(-s4[ptr[r]:ptr[r] + n4[r]], kind="stable")[:5]])
