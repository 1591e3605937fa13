"""The per-label linear classifiers of the re-ranker's linear_score (slide.rank.linear)."""
import numba
import numpy as np
import pytest
import scipy.sparse as sp

import slide
from slide.rank import linear as label_linear
from slide.rank.head import HeadClassifiers, head_labels
from slide.rank.linear import LabelLinear, OneVsRest
from slide.kernels.output import OutputLayer
from test_rerank import SMALL, keyword_data


@pytest.fixture(scope="module")
def fitted():
    Xtr, Ytr = keyword_data(2400, 0)
    Xte, Yte = keyword_data(400, 1)
    m = slide.SlideClassifier(epochs=1, neighbours=0, **SMALL).fit(Xtr, Ytr)
    return m.network_, Xtr, Ytr, Xte, Yte


def test_training_pairs_are_the_true_labels_then_the_other_top_labels():
    top = np.array([[3, 1, 7], [2, -1, 5], [0, 4, 6]])
    Y = sp.csr_matrix(np.array([[0, 1, 0, 1, 0, 0, 0, 0],
                                [0, 0, 0, 0, 0, 0, 0, 0],
                                [1, 0, 0, 0, 1, 0, 1, 0]], np.float32))
    ptr, labels, targets = label_linear.training_pairs(top, Y.indptr.astype(np.int64),
                                                       Y.indices.astype(np.int64))
    np.testing.assert_array_equal(ptr, [0, 3, 5, 8])
    np.testing.assert_array_equal(labels, [1, 3, 7, 2, 5, 0, 4, 6])
    np.testing.assert_array_equal(targets, [1, 1, 0, 0, 0, 1, 1, 1])


def test_table_bits_follow_the_updates_within_bounds():
    assert label_linear.table_bits(10) == label_linear.MIN_BITS
    assert label_linear.table_bits(3_000_000) == 22
    assert label_linear.table_bits(10 ** 12) == label_linear.MAX_BITS


def _rank_of_truth(scores_of, net, X, Y, n_top=10):
    """Share of rows whose best-scored label among the network's top n_top and their true
    labels is a true one."""
    from slide.kernels.topk import topk_of_logits
    Wo, bo = net.output_view()
    _, top = topk_of_logits(net.hidden(X), Wo, bo, n_top)
    hits = 0
    for r in range(X.shape[0]):
        cand = np.union1d(top[r], Y[r].indices)
        s = scores_of(r, cand)
        hits += Y[r, cand[np.argmax(s)]] > 0
    return hits / X.shape[0]


@pytest.mark.parametrize("kind", ["hashed", "ovr"])
def test_fit_learns_the_words_that_name_each_label(fitted, kind):
    net, Xtr, Ytr, Xte, Yte = fitted
    rows = np.arange(Xtr.shape[0])
    if kind == "hashed":
        lin = LabelLinear.fit(net.output_layer(), net.hidden(Xtr), Xtr, Ytr, rows, seed=0)
    else:
        lin = OneVsRest.fit(Xtr, Ytr, rows, seed=0)
        assert lin.weights.shape == (int((np.bincount(Xtr.indices) > 0).sum()), Ytr.shape[1])
    X = sp.csr_matrix(Xte)

    def linear(r, cand):
        F = np.zeros((cand.shape[0], 1))
        lin.score_into(X[r], np.array([0, cand.shape[0]], np.int64),
                       np.array([cand.shape[0]]), cand.astype(np.int64), F, 0)
        return F[:, 0]

    def prior(r, cand):
        return np.log1p(np.asarray(Ytr.sum(axis=0)).ravel()[cand])

    # the words name the labels: the classifiers pick a true label among the hard negatives
    # far more often than the label frequency does
    acc, base = _rank_of_truth(linear, net, X, Yte), _rank_of_truth(prior, net, X, Yte)
    assert acc > 0.9 and acc > base + 0.2


def test_fit_uses_at_most_max_work_rows(fitted, monkeypatch):
    net, Xtr, Ytr, _, _ = fitted
    seen = []
    real = label_linear.training_pairs

    def spy(top, y_ptr, y_ids):
        seen.append(top.shape[0])
        return real(top, y_ptr, y_ids)
    monkeypatch.setattr(label_linear, "training_pairs", spy)
    monkeypatch.setattr(label_linear, "MAX_WORK", 300 * Ytr.shape[1])
    LabelLinear.fit(net.output_layer(), net.hidden(Xtr), Xtr, Ytr, np.arange(Xtr.shape[0]),
                    seed=0)
    assert seen == [300]


# one block; blocks of 64 rows and chunks of 40 labels; blocks of 8 rows
@pytest.mark.parametrize("min_rows, entries, chunk",
                         [(512, 4 << 20, 32768), (8, 640, 40), (8, 300 * 7, 32768)])
def test_hard_negatives_are_each_rows_top_logits_in_any_blocking(monkeypatch, min_rows,
                                                                 entries, chunk):
    # the same ids as a dense argsort of the logits, however rows and labels are blocked
    # (integer weights: every product exact, ties are ties)
    from slide.rank import linear as label_linear
    rng = np.random.default_rng(5)
    H = rng.integers(-3, 4, size=(120, 8)).astype(np.float32)
    Wo = rng.integers(-3, 4, size=(300, 8)).astype(np.float32)
    bo = rng.integers(-2, 3, size=300).astype(np.float32)

    monkeypatch.setattr(label_linear, "_MIN_BLOCK_ROWS", min_rows)
    monkeypatch.setattr(label_linear, "_BLOCK_ENTRIES", entries)
    monkeypatch.setattr(label_linear, "_CHUNK", chunk)
    rows = np.sort(rng.choice(120, 100, replace=False)).astype(np.int64)
    got = label_linear.hard_negatives(OutputLayer(Wo, bo, False), H, rows, 6)
    S = H[rows] @ Wo.T + bo
    expect = np.argsort(-S, axis=1, kind="stable")[:, :6]
    np.testing.assert_array_equal(got, expect)


def test_topk_of_logits_is_the_sorted_top_with_ties_to_the_lower_id():
    from slide.kernels.topk import topk_ids_of_logits, topk_of_logits
    rng = np.random.default_rng(4)
    # small integers: every dot product exact, so ties are ties in any BLAS blocking
    H = rng.integers(-3, 4, size=(50, 8)).astype(np.float32)
    Wo = rng.integers(-3, 4, size=(300, 8)).astype(np.float32)
    Wo[200:] = Wo[:100]                     # labels 200..299 tie with 0..99
    bo = np.zeros(300, np.float32)
    got = topk_ids_of_logits(H, Wo, bo, 7, chunk=64)     # several chunks
    S = H @ Wo.T
    expect = np.argsort(-S, axis=1, kind="stable")[:, :7]
    np.testing.assert_array_equal(got, expect)
    scores, ids = topk_of_logits(H, Wo, bo, 7, chunk=64)
    np.testing.assert_array_equal(ids, expect)
    np.testing.assert_array_equal(scores, np.take_along_axis(S, expect, axis=1))
    assert topk_ids_of_logits(H, Wo[:5], bo[:5], 7).shape == (50, 5)
    assert topk_of_logits(H, Wo[:5], bo[:5], 7)[0].shape == (50, 5)


def test_rows_are_cut_to_their_strongest_entries_for_the_classifiers():
    X = sp.csr_matrix(np.array([[0.1, -0.9, 0.0, 0.5, 0.5, 0.2],
                                [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                                [0.3, 0.0, 0.0, 0.0, 0.0, 0.0],
                                [0.4, 0.4, 0.4, 0.0, 0.0, 0.0]], np.float32))
    assert label_linear.strongest_terms(X, 5) is X           # no row is longer
    got = label_linear.strongest_terms(X, 2).toarray()
    expect = np.array([[0, -0.9, 0, 0.5, 0, 0],        # ties: the earlier entry
                       [0, 0, 0, 0, 0, 0],
                       [0.3, 0, 0, 0, 0, 0],
                       [0.4, 0.4, 0, 0, 0, 0]], np.float32)
    np.testing.assert_array_equal(got, expect)
    # a cut row scores as its cut form would, renormalised
    rng = np.random.default_rng(2)
    lin = LabelLinear(rng.normal(size=1 << 8).astype(np.float32),
                      rng.normal(size=4).astype(np.float32))
    wide = sp.csr_matrix(rng.random((1, 300)).astype(np.float32))
    cut = label_linear.strongest_terms(wide)
    assert cut.nnz == label_linear.MAX_ROW_TERMS
    F = np.zeros((4, 2))
    ptr, n, ids = np.array([0, 4], np.int64), np.array([4]), np.arange(4, dtype=np.int64)
    lin.score_into(wide, ptr, n, ids, F, 0)
    label_linear.score_candidates(ptr, n, ids, cut.indptr.astype(np.int64), cut.indices,
                                  cut.data, lin.weights, lin.bias, lin.mask, F, 1)
    np.testing.assert_allclose(F[:, 0], F[:, 1], rtol=1e-6)


# -- one-vs-rest ---------------------------------------------------------------------------------

def _reference_ovr_step(x, kept, y, W, slot, feature_g2, label_g2, total_g2, bias, bias_g2,
                        lr):
    """One row's step of ``ovr_epoch`` in numpy (float64), in place."""
    v = x / np.linalg.norm(x)
    fs = [f for f in np.flatnonzero(x) if kept[f]]
    z = bias + sum(v[f] * W[slot[f]] for f in fs)
    g = 1.0 / (1.0 + np.exp(-z)) - y
    bias_g2 += g * g
    bias -= lr * g / np.sqrt(bias_g2 + 1e-8)
    kept_sq = sum(v[f] ** 2 for f in fs)
    label_g2 += g * g * kept_sq
    total_g2 += (g * g).sum() * kept_sq
    step = lr * g / np.sqrt(label_g2 + 1e-12)
    clipped = 0
    for f in fs:
        feature_g2[slot[f]] += v[f] ** 2 * (g * g).sum()
        delta = v[f] / np.sqrt(feature_g2[slot[f]] / total_g2[0] + 1e-12) * step
        clipped += int((np.abs(delta) > lr).sum())
        W[slot[f]] -= np.clip(delta, -lr, lr)
    return clipped


def test_ovr_epoch_is_factored_adagrad_on_every_label_with_steps_clipped():
    rng = np.random.default_rng(3)
    Xd = np.array([[0.5, 0.0, 2.0, 0.0, 1.0, 0.0],
                   [0.0, 1.5, 0.3, 0.0, 0.0, 0.7],
                   [1.0, 0.0, 0.0, 0.0, 0.2, 0.9]])
    Yd = np.array([[1, 0, 0, 1], [0, 1, 0, 0], [0, 0, 1, 1]], np.float64)
    slot = np.array([0, 1, 2, -1, 3, -1], np.int32)     # features 3 and 5 not kept
    X, Y = sp.csr_matrix(Xd, dtype=np.float32), sp.csr_matrix(Yd, dtype=np.float32)
    W = rng.normal(size=(4, 4)).astype(np.float32)
    state = [W, np.full(4, 0.5), np.full(4, 0.25), np.array([1.0]),
             rng.normal(size=4).astype(np.float32), np.full(4, 0.1, np.float32)]
    ref = [a.astype(np.float64) for a in state]
    clipped = 0
    for r in (0, 2, 1, 0):                  # one row a call: the order of a single thread
        label_linear.ovr_epoch(X.indptr.astype(np.int64), X.indices, X.data, slot,
                               Y.indptr.astype(np.int64), Y.indices.astype(np.int64),
                               np.array([r]), *state, np.float32(0.3))
        clipped += _reference_ovr_step(Xd[r], slot >= 0, Yd[r], ref[0], slot, *ref[1:], 0.3)
    assert 0 < clipped < 4 * 3 * 4         # some steps clipped to the learning rate, not all
    for got, expect in zip(state, ref):
        np.testing.assert_allclose(got, expect, rtol=2e-5, atol=1e-6)


def test_ovr_epoch_parts_step_their_own_label_sums_and_merge_every_change():
    """Rows in parts side by side: each part steps its own copy of the bias and the label and
    total sums from the round's start (the weights and the features' sums shared), and the
    round adds every part's change; on one thread the parts run in order, so a numpy
    reference of that gives the same values. One part is plain row-after-row SGD."""
    rng = np.random.default_rng(5)
    n, n_f, n_l = 150, 12, 5
    Xd = (rng.random((n, n_f)) < 0.3) * rng.random((n, n_f))
    Xd[:, 0] += 0.1                                     # no empty row
    Yd = (rng.random((n, n_l)) < 0.3).astype(np.float64)
    slot = np.where(np.arange(n_f) % 4 == 3, -1, 0).astype(np.int32)
    slot[slot == 0] = np.arange(int((slot == 0).sum()))
    X, Y = sp.csr_matrix(Xd, dtype=np.float32), sp.csr_matrix(Yd, dtype=np.float32)
    W0 = (0.1 * rng.normal(size=(int(slot.max()) + 1, n_l))).astype(np.float32)
    order = rng.permutation(n)
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        for n_parts in (1, 3):
            state = [W0.copy(), np.full(W0.shape[0], 0.5), np.full(n_l, 0.25), np.array([1.0]),
                     np.zeros(n_l, np.float32), np.full(n_l, 0.1, np.float32)]
            ref = [a.astype(np.float64) for a in state]
            label_linear.ovr_epoch(X.indptr.astype(np.int64), X.indices, X.data, slot,
                                   Y.indptr.astype(np.int64), Y.indices.astype(np.int64),
                                   order, *state, np.float32(0.3), n_parts)
            rows = label_linear.OVR_ROUND_ROWS
            W, feature_g2, label_g2, total_g2, bias, bias_g2 = ref
            for r0 in range(0, n, n_parts * rows):
                start = [a.copy() for a in (label_g2, total_g2, bias, bias_g2)]
                ends = []
                for part in range(n_parts):
                    own = [a.copy() for a in start]
                    for q in range(r0 + part * rows, min(n, r0 + (part + 1) * rows)):
                        _reference_ovr_step(Xd[order[q]], slot >= 0, Yd[order[q]], W, slot,
                                            feature_g2, *own, 0.3)
                    ends.append(own)
                for i, a in enumerate((label_g2, total_g2, bias, bias_g2)):
                    a[:] = start[i] + sum(e[i] - start[i] for e in ends)
            for got, expect in zip(state, ref):
                np.testing.assert_allclose(got, expect, rtol=5e-5, atol=1e-5)
            if n_parts == 1:
                one_part = [a.copy() for a in state]
            else:       # the parts did not see each other's bias: not the one-part result
                assert not np.allclose(state[4], one_part[4], rtol=1e-4)
    finally:
        numba.set_num_threads(before)


def test_kept_features_are_the_most_frequent_within_the_weight_budget(monkeypatch):
    # document frequencies 3, 0, 5, 3, 1, 5
    rows = [[0, 2, 3, 5], [0, 2, 3, 5], [0, 2, 3, 5, 4], [2, 5], [2, 5]]
    X = sp.csr_matrix((np.ones(sum(map(len, rows)), np.float32), np.concatenate(rows),
                       np.cumsum([0] + [len(r) for r in rows])), shape=(5, 6))
    np.testing.assert_array_equal(label_linear.kept_features(X, 2), [0, -1, 1, 2, 3, 4])
    monkeypatch.setattr(label_linear, "MAX_OVR_WEIGHTS", 7)     # 3 features of 2 labels
    # 2 and 5 (five rows), then 0 before 3 (three rows each: the lower id)
    np.testing.assert_array_equal(label_linear.kept_features(X, 2), [0, -1, 1, -1, -1, 2])


def test_ovr_scores_are_the_bias_plus_the_kept_weights_over_the_unit_row():
    rng = np.random.default_rng(5)
    X = sp.random(6, 20, density=0.4, random_state=2, format="csr", dtype=np.float32)
    slot = np.full(20, -1, np.int32)
    slot[::2] = np.arange(10)                           # the odd features not kept
    ovr = OneVsRest(rng.normal(size=(10, 7)).astype(np.float32), slot,
                    rng.normal(size=7).astype(np.float32))
    ptr = np.arange(0, 6 * 7 + 1, 7, dtype=np.int64)
    ids = np.tile(np.arange(7, dtype=np.int64), 6)
    F = np.zeros((42, 2))
    ovr.score_into(X, ptr, np.full(6, 7, np.int64), ids, F, 1)
    Xd = X.toarray()
    Wfull = np.zeros((20, 7))
    Wfull[::2] = ovr.weights
    norms = np.linalg.norm(Xd, axis=1, keepdims=True)
    expect = ovr.bias + (Xd / np.where(norms > 0, norms, 1)) @ Wfull
    np.testing.assert_allclose(F[:, 1].reshape(6, 7), expect, rtol=1e-5, atol=1e-6)
    assert (F[:, 0] == 0).all()


def test_the_classifiers_are_one_vs_rest_only_within_the_work_bound(fitted, monkeypatch):
    net, Xtr, Ytr, _, _ = fitted
    rows = np.arange(0, Xtr.shape[0], 2)
    work = float(np.minimum(np.diff(Xtr.indptr)[rows], label_linear.MAX_ROW_TERMS).sum()
                 * Ytr.shape[1] * label_linear.OVR_EPOCHS)
    monkeypatch.setattr(label_linear, "MAX_OVR_WORK", work)
    assert isinstance(label_linear.fit_classifiers(net.output_layer(), net.hidden(Xtr), Xtr,
                                                     Ytr, rows), OneVsRest)
    monkeypatch.setattr(label_linear, "MAX_OVR_WORK", work - 1)
    assert isinstance(label_linear.fit_classifiers(net.output_layer(), net.hidden(Xtr), Xtr,
                                                     Ytr, rows), LabelLinear)


def _neighbour_negatives_reference(H, Y, rows, k, n_neighbours):
    """Dense numpy: each row's n_neighbours most similar other rows of ``rows`` (cosine),
    their labels weighted by max(similarity, 0) ** POWER, the row's own labels left out."""
    E = H[rows].astype(np.float64)
    E /= np.linalg.norm(E, axis=1, keepdims=True)
    S = E @ E.T
    Yr = Y[rows].toarray() > 0
    out = np.full((rows.shape[0], k), -1, np.int64)
    for i in range(rows.shape[0]):
        order = [r for r in np.argsort(-S[i], kind="stable") if r != i][:n_neighbours]
        votes = np.zeros(Y.shape[1])
        for r in order:
            votes[Yr[r]] += max(S[i, r], 0.0) ** label_linear.POWER
        votes[Yr[i]] = 0.0
        best = [j for j in np.argsort(-votes, kind="stable") if votes[j] > 0][:k]
        out[i, :len(best)] = best
    return out


def test_neighbour_negatives_are_the_labels_the_other_nearest_rows_vote_for():
    rng = np.random.default_rng(7)
    n, n_labels = 60, 40
    H = rng.standard_normal((n, 6)).astype(np.float32)
    Y = sp.csr_matrix((rng.random((n, n_labels)) < 0.08).astype(np.float32))
    rows = np.sort(rng.choice(n, 45, replace=False)).astype(np.int64)
    got = label_linear.neighbour_negatives(H, Y, rows, 5, 4)
    np.testing.assert_array_equal(got, _neighbour_negatives_reference(H, Y, rows, 5, 4))
    Yr = Y[rows].toarray() > 0
    for i in range(rows.shape[0]):
        ids = got[i][got[i] >= 0]
        assert not Yr[i, ids].any()                     # never the row's own labels


def test_neighbour_negatives_skip_the_row_itself_and_dissimilar_rows():
    # rows 0 and 1 point the same way, row 2 the opposite way: row 0's only neighbour with a
    # positive similarity is row 1, whose labels other than row 0's are its negatives; row 1's
    # is row 0, whose one label is row 1's own; row 2 has none (and never counts itself)
    H = np.array([[1.0, 0.0], [0.9, 0.1], [-1.0, 0.0]], np.float32)
    Y = sp.csr_matrix(np.array([[1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 1]], np.float32))
    got = label_linear.neighbour_negatives(H, Y, np.arange(3, dtype=np.int64), 3, 2)
    np.testing.assert_array_equal(got[0], [1, 2, -1])
    np.testing.assert_array_equal(got[2], [-1, -1, -1])
    np.testing.assert_array_equal(got[1], [-1, -1, -1])


def test_labels_outnumbering_the_used_rows_take_negatives_from_the_neighbours(fitted,
                                                                               monkeypatch):
    net, Xtr, Ytr, _, _ = fitted
    calls = []
    real_nb, real_net = label_linear.neighbour_negatives, label_linear.hard_negatives

    def spy_nb(*a):
        calls.append("neighbours")
        return real_nb(*a)

    def spy_net(*a):
        calls.append("network")
        return real_net(*a)
    monkeypatch.setattr(label_linear, "neighbour_negatives", spy_nb)
    monkeypatch.setattr(label_linear, "hard_negatives", spy_net)
    rows = np.arange(Xtr.shape[0])
    # fewer used rows than labels: the neighbours (when there is a vote to imitate)
    monkeypatch.setattr(label_linear, "MAX_WORK", (Ytr.shape[1] // 2) * Ytr.shape[1])
    LabelLinear.fit(net.output_layer(), net.hidden(Xtr), Xtr, Ytr, rows, 0, 20)
    LabelLinear.fit(net.output_layer(), net.hidden(Xtr), Xtr, Ytr, rows, 0, 0)
    # as many used rows as labels or more: the network's logits are the cheaper
    monkeypatch.setattr(label_linear, "MAX_WORK", 2 * Ytr.shape[1] * Ytr.shape[1])
    LabelLinear.fit(net.output_layer(), net.hidden(Xtr), Xtr, Ytr, rows, 0, 20)
    assert calls == ["neighbours", "network", "network"]
    assert label_linear.negatives_by_neighbours(99, 100, 20)
    assert not label_linear.negatives_by_neighbours(100, 100, 20)
    assert not label_linear.negatives_by_neighbours(10, 100, 0)


def test_head_labels_are_the_frequent_ones_the_most_frequent_when_capped():
    Y = sp.csr_matrix(np.array([[1, 1, 0, 1, 0],
                                [1, 0, 0, 1, 1],
                                [1, 1, 0, 0, 1],
                                [0, 1, 1, 1, 1]], np.float32))
    rows = np.arange(4)
    # counts 3, 3, 1, 3, 3
    assert head_labels(Y, rows, 10, min_rows=3).tolist() == [0, 1, 3, 4]
    assert head_labels(Y, rows, 2, min_rows=3).tolist() == [0, 1]  # ties: lower
    assert head_labels(Y, np.array([0, 1]), 10, min_rows=2).tolist() == [0, 3]
    assert head_labels(Y, rows, 10, min_rows=5).tolist() == []


def test_head_classifiers_are_one_vs_rest_on_the_head_and_zero_elsewhere(fitted):
    _, Xtr, Ytr, Xte, _ = fitted
    rows = np.arange(0, Xtr.shape[0], 2)
    counts = np.bincount(Ytr[rows].indices, minlength=Ytr.shape[1])
    min_rows = int(np.sort(counts)[-4])                   # about the four most frequent
    n_threads = numba.get_num_threads()
    numba.set_num_threads(1)        # one thread: the two fits are the same arithmetic
    try:
        head = HeadClassifiers.fit(Xtr, Ytr, rows, seed=3, min_rows=min_rows)
        ovr = OneVsRest.fit(Xtr, sp.csr_matrix(Ytr[:, head.labels]), rows, seed=3)
    finally:
        numba.set_num_threads(n_threads)
    np.testing.assert_array_equal(head.labels, np.flatnonzero(counts >= min_rows))
    n, h, L = 30, head.labels.shape[0], Ytr.shape[1]
    X = sp.csr_matrix(Xte[:n])
    got = np.full((n * L, 2), np.nan)
    head.score_into(X, np.arange(0, n * L + 1, L, dtype=np.int64), np.full(n, L, np.int64),
                    np.tile(np.arange(L, dtype=np.int64), n), got, 1)
    ref = np.zeros((n * h, 1))
    ovr.score_into(X, np.arange(0, n * h + 1, h, dtype=np.int64), np.full(n, h, np.int64),
                   np.tile(np.arange(h, dtype=np.int64), n), ref, 0)
    got = got[:, 1].reshape(n, L)
    np.testing.assert_array_equal(got[:, head.labels], ref.reshape(n, h))
    others = np.setdiff1d(np.arange(Ytr.shape[1]), head.labels)
    assert np.all(got[:, others] == 0.0)
    # none qualifies: no head
    assert HeadClassifiers.fit(Xtr, Ytr, rows, min_rows=rows.shape[0] + 1) is None
