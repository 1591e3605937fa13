"""The label centroids' retrieval index (slide.rank.centroids): the pruned inverted lists and
each row's best labels against a brute-force reference, the retrieved labels among the
re-ranker's candidates, and a re-ranker fitted with them through fit, save and load."""
import numpy as np
import pytest
import scipy.sparse as sp

import slide
from slide.rank import candidates, centroids, rerank
from tests.test_rerank import SMALL, keyword_data


def _reference_index(C, per_feature):
    """{feature: {label: weight}} keeping each feature's per_feature largest weights, ties
    to the lower label."""
    C = sp.csc_matrix(C)
    out = {}
    for f in range(C.shape[1]):
        labs = C.indices[C.indptr[f]:C.indptr[f + 1]]
        w = C.data[C.indptr[f]:C.indptr[f + 1]]
        order = np.lexsort((labs, -w))[:per_feature]
        out[f] = dict(zip(labs[order].tolist(), w[order].tolist()))
    return out


def _reference_top(x, ref, n_labels, n_terms, k):
    """The k best labels (positive scores, best first) of one row by its n_terms heaviest
    entries (ties to the lower feature)."""
    x = sp.csr_matrix(x)
    order = np.lexsort((x.indices, -x.data))[:n_terms]
    score = np.zeros(n_labels)
    for f, v in zip(x.indices[order], x.data[order]):
        for j, w in ref[f].items():
            score[j] += v * w
    best = [j for j in np.argsort(-score, kind="stable") if score[j] > 0][:k]
    return best, score


def test_the_index_keeps_each_features_heaviest_labels_ties_to_the_lower_label():
    # feature 0: five labels, two tied at the cut; feature 2: fewer than the cut
    C = sp.csr_matrix(np.array([[0.5, 0, 0.1], [0.2, 0.3, 0], [0.2, 0, 0], [0.9, 0, 0.4],
                                [0.2, 0.1, 0]], np.float32))
    ix = centroids.build_index((C.indptr.astype(np.int64), C.indices.astype(np.int32),
                                C.data), 3, per_feature=3)
    got = {f: dict(zip(ix.labels[ix.ptr[f]:ix.ptr[f + 1]].tolist(),
                       ix.weights[ix.ptr[f]:ix.ptr[f + 1]].tolist())) for f in range(3)}
    assert list(got[0]) == [0, 1, 3]                    # 0.9, 0.5 and the lower 0.2 (label 1)
    assert got == _reference_index(C, 3)
    assert ix.n_labels == 5 and ix.ptr[-1] == 7


@pytest.mark.parametrize("per_feature, n_terms", [(4, 3), (50, 50)])
def test_top_labels_match_a_brute_force_reference(per_feature, n_terms):
    rng = np.random.default_rng(3)
    X = sp.random(60, 40, density=0.2, format="csr", random_state=rng, dtype=np.float32)
    Y = sp.random(60, 25, density=0.1, format="csr", random_state=rng, dtype=np.float32)
    Y.data[:] = 1
    cen = centroids.label_centroids(X, Y, 12)
    C = sp.csr_matrix((cen[2], cen[1], cen[0]), shape=(25, 40))
    ix = centroids.build_index(cen, 40, per_feature)
    Xq = sp.random(30, 40, density=0.3, format="csr", random_state=rng, dtype=np.float32)
    Xq.sort_indices()
    k = 6
    top = centroids.top_labels(ix, Xq, k, n_terms)
    assert top.shape == (30, k) and top.dtype == np.int64
    ref = _reference_index(C, per_feature)
    for r in range(30):
        best, score = _reference_top(Xq[r], ref, 25, n_terms, k)
        got = [j for j in top[r] if j >= 0]
        assert np.all(top[r, len(got):] == -1)
        # the same labels by score (float32 sums: compare the scores, not tied orders)
        np.testing.assert_allclose(score[got], score[best], rtol=1e-5)
        assert set(got) == set(best) or len(got) == k
    if per_feature == 4:                                # the pruning changed what is found
        full = centroids.top_labels(centroids.build_index(cen, 40, 50), Xq, k, 50)
        assert not np.array_equal(top, full)


def test_retrieved_labels_join_the_candidates_once(tiny_fit):
    model, Xte = tiny_fit
    net, rank = model.network_, model.rank_
    R = rank.reranker
    X = Xte[:40]
    H = net.hidden(X)
    base = rerank.features(net.output_layer(), X, H, rank.memory, R.k_nn, R.centroids, 10,
                           linear=R.linear)
    retrieved = centroids.top_labels(centroids.build_index(R.centroids, X.shape[1]), X, 8)
    retrieved[0, -1] = -1                                # padding is skipped
    got = rerank.features(net.output_layer(), X, H, rank.memory, R.k_nn, R.centroids, 10,
                          linear=R.linear, retrieved=retrieved)
    n_new = 0
    for r in range(X.shape[0]):
        b_ids = base[2][base[0][r]:base[0][r] + base[1][r]]
        g_ids = got[2][got[0][r]:got[0][r] + got[1][r]]
        # the old candidates first, with their features unchanged, then the new ones once
        np.testing.assert_array_equal(g_ids[:b_ids.shape[0]], b_ids)
        np.testing.assert_allclose(got[3][got[0][r]:got[0][r] + base[1][r]],
                                   base[3][base[0][r]:base[0][r] + base[1][r]])
        extra = [j for j in retrieved[r] if j >= 0 and j not in set(b_ids.tolist())]
        assert g_ids[b_ids.shape[0]:].tolist() == list(dict.fromkeys(extra))
        F_new = got[3][got[0][r] + base[1][r]:got[0][r] + got[1][r]]
        assert np.all(F_new[:, candidates.VOTE] == 0) and np.all(F_new[:, candidates.NETWORK_RANK] == 1)
        n_new += len(extra)
    assert n_new > 0


@pytest.fixture(scope="module")
def tiny_fit():
    Xtr, Ytr = keyword_data(2400, 0)
    Xte, _ = keyword_data(200, 1)
    return slide.SlideClassifier(epochs=1, **SMALL).fit(Xtr, Ytr), Xte


def test_a_reranker_fitted_with_retrieved_labels_saves_and_loads(monkeypatch, tmp_path):
    Xtr, Ytr = keyword_data(2400, 0)
    Xte, _ = keyword_data(200, 1)
    monkeypatch.setattr(rerank, "N_CANDIDATES", 6)
    m = slide.SlideClassifier(epochs=1, **SMALL).fit(Xtr, Ytr)
    R = m.rank_.reranker
    assert R.n_retrieved == 6 and R.retrieve(Xte).shape == (200, 6)
    top = m.predict_topk(Xte, k=5)
    m.save(tmp_path / "m.slide")
    loaded = slide.load(tmp_path / "m.slide")
    assert loaded.rank_.reranker.n_retrieved == 6
    np.testing.assert_array_equal(loaded.predict_topk(Xte, k=5), top)
    # the same weights without the retrieved labels rank differently somewhere
    R.n_retrieved = 0
    assert R.retrieve(Xte) is None
    assert not np.array_equal(m.predict_topk(Xte, k=5), top)


def test_a_bad_retrieved_count_in_a_saved_reranker_is_refused(tiny_fit):
    model, _ = tiny_fit
    d = model.rank_.reranker.state_dict()
    assert d["n_retrieved"] == 0
    n_labels, n_features = model.n_labels_, model.network_.layout.n_in[0]
    old = {k: v for k, v in d.items() if k != "n_retrieved"}      # written before the index
    assert rerank.ReRanker.from_state(old, n_labels, n_features).n_retrieved == 0
    for bad in (-1, 2.5, "3"):
        with pytest.raises(ValueError, match="n_retrieved"):
            rerank.ReRanker.from_state(dict(d, n_retrieved=bad), n_labels, n_features)
