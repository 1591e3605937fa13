"""``SlideSearch``: trials of one shape trained fused, scored on held-out rows, the winner
finished once; scikit-learn's search conventions; bad grids named."""
import numpy as np
import pytest

import slide
from slide.estimator import SlideClassifier
from slide.search import SlideSearch
from slide.warmup import tiny_data

TINY = dict(hidden_sizes=(8,), L=2, K=2, range_pow=6, sampler_budget=16, shared_negatives=8,
            batch_size=8, epochs=3, n_threads=1, neighbours=0, random_state=4)


@pytest.fixture(scope="module")
def data():
    return tiny_data()


@pytest.fixture(scope="module")
def searched(data):
    grid = [{"learning_rate": [1e-4, 1e-2], "hidden_sizes": [(8,), (12,)]},
            {"learning_rate": [1e-2], "batch_size": [16]}]
    return SlideSearch(SlideClassifier(**TINY), grid, validation_fraction=0.25).fit(*data)


def test_results_follow_sklearn_conventions(searched):
    res = searched.cv_results_
    assert len(res["params"]) == 5
    assert sorted(res["param_learning_rate"]) == [1e-4, 1e-4, 1e-2, 1e-2, 1e-2]
    # a key a grid does not list is masked in its trials
    assert res["param_batch_size"].mask.sum() == 4 and res["param_hidden_sizes"].mask.sum() == 1
    assert res["rank_test_score"].min() == 1
    best = searched.best_index_
    assert res["rank_test_score"][best] == 1
    assert searched.best_score_ == res["mean_test_score"].max()
    assert searched.best_params_ == res["params"][best]
    # two batch sizes: two passes; the four trials of batch size 8 (two widths) in one
    groups = [[p for p, g in zip(res["params"], res["fused_group"]) if g == gg]
              for gg in sorted(set(res["fused_group"]))]
    assert sorted(len(g) for g in groups) == [1, 4]
    assert all("batch_size" not in p for p in max(groups, key=len))


def test_a_trial_is_the_fit_it_would_get_alone(data, searched):
    """Every trial uses the template's seed and order of rows: the winner's network is the
    one SlideClassifier(**best_params_) trains alone on the same rows (one thread, one batch
    in flight), and its held-out score is that network's."""
    X, Y = data
    best = searched.best_estimator_
    alone = SlideClassifier(**dict(TINY, **searched.best_params_), batches_in_flight=1)
    hs, sparse = alone._checked_params()
    alone._build(X.shape[1], Y.shape[1], hs, sparse)
    fit_rows, held, _ = searched._split(alone, X.shape[0], Y.shape[1], searched.seed_)
    slide.fused.train_members([alone], X, Y, fit_rows, searched.seed_, 1)
    np.testing.assert_array_equal(alone.network_.W, best.network_.W)
    assert searched.n_held_out_ == held.shape[0] == 10


def test_the_winner_predicts_and_is_at_least_as_good_as_every_trial(data, searched):
    X, Y = data
    top = searched.predict_topk(X, k=2)
    assert top.shape == (X.shape[0], 2)
    np.testing.assert_array_equal(top, searched.best_estimator_.predict_topk(X, k=2))
    assert searched.best_score_ >= max(searched.cv_results_["mean_test_score"])


def test_the_winner_gets_its_reranker_on_the_held_out_rows():
    from tests.test_rerank import SMALL, keyword_data
    Xtr, Ytr = keyword_data(2400, 0)
    s = SlideSearch(SlideClassifier(epochs=1, **SMALL),
                    {"learning_rate": [3e-3, 1e-2]}).fit(Xtr, Ytr)
    best = s.best_estimator_
    assert best.rank_.memory is not None and best.rank_.reranker is not None
    # scored on the re-ranker's held-out rows, which no trial trained on
    assert s.n_held_out_ == best._n_held(Xtr.shape[0], Ytr.shape[1]) > 0
    assert best.batches_ == -(-(Xtr.shape[0] - s.n_held_out_) // best.batch_size)


def test_refit_false_keeps_the_results_only(data):
    s = SlideSearch(SlideClassifier(**TINY), {"learning_rate": [1e-3]}, refit=False).fit(*data)
    assert s.best_params_ == {"learning_rate": 1e-3} and not hasattr(s, "best_estimator_")
    with pytest.raises(Exception, match="no best_estimator_"):
        s.predict_topk(data[0])


@pytest.mark.parametrize("grid, word", [
    ({}, "non-empty"),
    ([], "non-empty"),
    ({"learnign_rate": [1e-3]}, "not a SlideClassifier parameter"),
    ({"neighbours": [5, 10]}, "not searched"),
    ({"random_state": [1, 2]}, "not searched"),
    ({"learning_rate": []}, "at least one value"),
    ({"learning_rate": 0.1}, "at least one value"),
    ({"learning_rate": [-1.0]}, "learning_rate"),
])
def test_bad_grids_are_named(grid, word, data):
    with pytest.raises(ValueError, match=word):
        SlideSearch(SlideClassifier(**TINY), grid).fit(*data)


def test_bad_settings_are_named(data):
    with pytest.raises(ValueError, match="validation_fraction"):
        SlideSearch(SlideClassifier(**TINY), {"learning_rate": [1e-3]},
                    validation_fraction=0.9).fit(*data)
    with pytest.raises(ValueError, match="refit"):
        SlideSearch(SlideClassifier(**TINY), {"learning_rate": [1e-3]}, refit="yes").fit(*data)
    with pytest.raises(ValueError, match="estimator"):
        SlideSearch("model", {"learning_rate": [1e-3]}).fit(*data)


def test_label_names_and_pickling(data):
    import pickle
    X, Y = data
    names = [[f"tag{j}" for j in Y.indices[Y.indptr[i]:Y.indptr[i + 1]]] for i in range(X.shape[0])]
    s = SlideSearch(SlideClassifier(**TINY), {"learning_rate": [1e-3, 1e-2]}).fit(X, names)
    top = s.predict_topk(X, k=2, return_names=True)
    assert str(top[0, 0]).startswith("tag") and list(s.classes_) == list(
        s.best_estimator_.classes_)
    back = pickle.loads(pickle.dumps(s))
    np.testing.assert_array_equal(back.predict_topk(X, k=2), s.predict_topk(X, k=2))
    assert back.best_params_ == s.best_params_


def test_time_budget_is_the_searchs_shared_by_its_passes(data):
    X, Y = data
    s = SlideSearch(SlideClassifier(**dict(TINY, epochs=50), time_budget=1e-9),
                    [{"learning_rate": [1e-3, 1e-2]}, {"batch_size": [16]}]).fit(X, Y)
    # two passes; each stopped at its first check after one wave (an epoch of the tiny set)
    assert len(set(s.cv_results_["fused_group"])) == 2
    assert s.best_estimator_.budget_spent_ and s.best_estimator_.epoch_ == 1
    assert s.best_estimator_.time_budget == 1e-9


def test_a_trial_is_scored_by_its_networks_precision_at_5_on_the_held_out_rows(data, searched):
    """The stages after the network re-rank its top labels, so a trial's score is its
    network's P@5 on the held-out rows (``search.SCORE_K``), not its P@1."""
    from slide.data.inputs import take_rows
    from slide.metrics import precision_at_k
    X, Y = data
    best = searched.best_estimator_
    _, held, _ = searched._split(best, X.shape[0], Y.shape[1], searched.seed_)
    top = best.network_.predict_topk_exact(take_rows(X, held), 5)
    assert searched.best_score_ == pytest.approx(precision_at_k(take_rows(Y, held), top, 5))
    assert slide.search.SCORE_K == 5


@pytest.mark.parametrize("n_trials, factor, rounds", [
    (4, 3, [(1 / 9, 2), (1 / 3, 1)]),
    (4, 4, [(1 / 4, 1)]),
    (4, 2, [(1 / 4, 2), (1 / 2, 1)]),
    (5, 3, [(1 / 9, 2), (1 / 3, 1)]),
    (10, 3, [(1 / 27, 4), (1 / 9, 2), (1 / 3, 1)]),
    (1, 3, []),
    (4, None, []),
])
def test_halving_rounds(n_trials, factor, rounds):
    got = slide.search.halving_rounds(n_trials, factor)
    assert [k for _, k in got] == [k for _, k in rounds]
    np.testing.assert_allclose([f for f, _ in got], [f for f, _ in rounds])


@pytest.fixture(scope="module")
def halved(data):
    """Four trials of 9 epochs by 3: scored after 1 epoch (1/9), the best two after 3 (1/3);
    the last one trains on to epoch 9."""
    grid = {"learning_rate": [1e-4, 1e-3, 1e-2, 3e-2]}
    return SlideSearch(SlideClassifier(**dict(TINY, epochs=9)), grid, factor=3,
                       validation_fraction=0.25).fit(*data)


def test_halving_stops_the_worse_trials_part_way(data, halved):
    res = halved.cv_results_
    per_epoch = -(-(data[0].shape[0] - halved.n_held_out_) // TINY["batch_size"])
    assert halved.n_rounds_ == 2
    assert sorted(res["halving_round"]) == [1, 1, 2, 3]
    assert sorted(res["n_batches"]) == [per_epoch, per_epoch, 3 * per_epoch, 9 * per_epoch]
    best = halved.best_index_
    assert res["halving_round"][best] == 3 and res["rank_test_score"][best] == 1
    assert halved.best_estimator_.batches_ == 9 * per_epoch
    # a later round ranks first; the trials stopped after the first round by their scores
    second = int(np.flatnonzero(res["halving_round"] == 2)[0])
    assert res["rank_test_score"][second] == 2
    first_round = np.flatnonzero(res["halving_round"] == 1)
    a, b = first_round
    (ra, rb), (sa, sb) = res["rank_test_score"][first_round], res["mean_test_score"][first_round]
    assert min(ra, rb) == 3 and (ra < rb) == (sa > sb) and (ra == rb) == (sa == sb)
    assert halved.best_score_ == res["mean_test_score"][best]
    # the last trial's passes: all three rounds'; a trial stopped after round 1 had the first
    assert res["mean_fit_time"][best] > res["mean_fit_time"][a] > 0


def test_a_halved_winner_is_the_fit_it_would_get_alone(data, halved):
    """Paused at epoch ends and trained on, the winner is bit for bit the network
    SlideClassifier(**best_params_) trains alone on one thread."""
    X, Y = data
    alone = SlideClassifier(**dict(TINY, epochs=9, **halved.best_params_), batches_in_flight=1)
    hs, sparse = alone._checked_params()
    alone._build(X.shape[1], Y.shape[1], hs, sparse)
    fit_rows, _, _ = halved._split(alone, X.shape[0], Y.shape[1], halved.seed_)
    slide.fused.train_members([alone], X, Y, fit_rows, halved.seed_, 1)
    np.testing.assert_array_equal(alone.network_.W, halved.best_estimator_.network_.W)


def test_without_halving_every_trial_trains_to_the_end(data):
    grid = {"learning_rate": [1e-3, 1e-2, 3e-2]}
    s = SlideSearch(SlideClassifier(**TINY), grid, factor=None).fit(*data)
    res = s.cv_results_
    assert s.n_rounds_ == 0 and set(res["halving_round"]) == {1}
    assert len(set(res["n_batches"])) == 1 and s.best_score_ == res["mean_test_score"].max()


def test_refit_false_stops_when_one_trial_is_left(data):
    grid = {"learning_rate": [1e-4, 1e-3, 1e-2, 3e-2]}
    s = SlideSearch(SlideClassifier(**dict(TINY, epochs=9)), grid, refit=False).fit(*data)
    res = s.cv_results_
    assert sorted(res["halving_round"]) == [1, 1, 2, 2]
    assert res["n_batches"].max() == 3 * res["n_batches"].min()
    assert res["rank_test_score"][s.best_index_] == 1 and not hasattr(s, "best_estimator_")


def test_a_paused_pass_goes_on_as_if_uninterrupted(data):
    """``train_members`` paused at an epoch's end and called again: the same bits as one
    call (one thread). Paused by its clock, mid-epoch, it goes on from the next batch; the
    sync there changes dense Adam's arithmetic (not its sum), so that case is checked bit for
    bit with an optimizer whose sync changes nothing (``lazy_adam``)."""
    X, Y = data

    def built(**kw):
        ms = [SlideClassifier(**dict(TINY, learning_rate=lr, batch_size=2, **kw))
              for lr in (1e-3, 1e-2)]
        for m in ms:
            hs, sparse = m._checked_params()
            m._build(X.shape[1], Y.shape[1], hs, sparse)
        return ms

    whole, paused = built(), built()
    slide.fused.train_members(whole, X, Y, None, 3, 1)
    slide.fused.train_members(paused, X, Y, None, 3, 1, pause_epoch=2)
    assert [m.epoch_ for m in paused] == [2, 2]
    slide.fused.train_members(paused, X, Y, None, 3, 1)
    whole_lazy, timed = built(optimizer="lazy_adam"), built(optimizer="lazy_adam")
    slide.fused.train_members(whole_lazy, X, Y, None, 3, 1)
    assert -(-X.shape[0] // 2) > slide.fused.WAVE_BATCHES
    slide.fused.train_members(timed, X, Y, None, 3, 1, pause_seconds=1e-9)
    assert [m.batches_ for m in timed] == [slide.fused.WAVE_BATCHES] * 2    # after one wave
    slide.fused.train_members(timed, X, Y, None, 3, 1)
    for w, p, wl, t in zip(whole, paused, whole_lazy, timed):
        assert w.batches_ == p.batches_ == wl.batches_ == t.batches_ > 0
        np.testing.assert_array_equal(w.network_.W, p.network_.W)
        np.testing.assert_array_equal(wl.network_.W, t.network_.W)


def test_members_at_different_positions_are_refused(data):
    X, Y = data
    ms = [SlideClassifier(**TINY) for _ in range(2)]
    for m in ms:
        hs, sparse = m._checked_params()
        m._build(X.shape[1], Y.shape[1], hs, sparse)
    slide.fused.train_members(ms[:1], X, Y, None, 3, 1, pause_epoch=1)
    with pytest.raises(ValueError, match="agree in batches_"):
        slide.fused.train_members(ms, X, Y, None, 3, 1)


@pytest.mark.parametrize("factor", [1, 0, 2.5, True, "3"])
def test_a_bad_factor_is_named(data, factor):
    with pytest.raises(ValueError, match="factor"):
        SlideSearch(SlideClassifier(**TINY), {"learning_rate": [1e-3]}, factor=factor).fit(*data)


def test_halving_compares_passes_at_the_same_share_of_their_own_schedules(data):
    """Trials of two batch sizes (two passes) halved by 3: three trials, one round, at a third
    of each pass's own epochs; the one left trains to the end of its schedule."""
    X, Y = data
    grid = [{"learning_rate": [1e-4, 1e-2]}, {"batch_size": [16]}]
    s = SlideSearch(SlideClassifier(**dict(TINY, epochs=9)), grid,
                    validation_fraction=0.25).fit(X, Y)
    res = s.cv_results_
    n_fit = X.shape[0] - s.n_held_out_
    per_epoch = [-(-n_fit // p.get("batch_size", TINY["batch_size"])) for p in res["params"]]
    assert s.n_rounds_ == 1 and len(set(res["fused_group"])) == 2
    for i, p in enumerate(res["params"]):
        epochs = 9 if i == s.best_index_ else 3
        assert res["n_batches"][i] == epochs * per_epoch[i]
        assert res["halving_round"][i] == (2 if i == s.best_index_ else 1)


@pytest.mark.parametrize("factor", [3, None])
def test_a_diverging_trial_is_out_of_the_search_not_the_end_of_it(data, factor):
    """As scikit-learn's searches score a failed fit nan and go on: a trial whose loss turns
    non-finite stops with a warning, scores nan and ranks last; the others are unaffected."""
    from sklearn.exceptions import FitFailedWarning
    grid = {"learning_rate": [1e-2, 1e38]}
    template = SlideClassifier(**dict(TINY, optimizer="sgd"))
    with pytest.warns(FitFailedWarning, match="diverged"):
        s = SlideSearch(template, grid, factor=factor).fit(*data)
    res = s.cv_results_
    assert np.isnan(res["mean_test_score"][1]) and res["rank_test_score"][1] == 2
    assert s.best_params_ == {"learning_rate": 1e-2} and np.isfinite(s.best_score_)
    alone = SlideSearch(template, {"learning_rate": [1e-2]}, factor=factor).fit(*data)
    np.testing.assert_array_equal(alone.best_estimator_.network_.W, s.best_estimator_.network_.W)


def test_a_search_whose_every_trial_diverges_says_so(data):
    template = SlideClassifier(**dict(TINY, optimizer="sgd"))
    with pytest.warns(Warning), pytest.raises(ValueError, match="every trial left .* diverged"):
        SlideSearch(template, {"learning_rate": [1e37, 1e38]}).fit(*data)


def test_a_fused_pass_raises_a_members_divergence_unless_asked_to_go_on(data):
    X, Y = data

    def built(*rates):
        ms = [SlideClassifier(**dict(TINY, optimizer="sgd", learning_rate=lr)) for lr in rates]
        for m in ms:
            hs, sparse = m._checked_params()
            m._build(X.shape[1], Y.shape[1], hs, sparse)
        return ms

    with pytest.raises(slide.network.trainer.DivergenceError, match="member 1"):
        slide.fused.train_members(built(1e-2, 1e38), X, Y, None, 3, 1)
    diverged = {}
    pair, (alone,) = built(1e-2, 1e38), built(1e-2)
    slide.fused.train_members(pair, X, Y, None, 3, 1, diverged=diverged)
    slide.fused.train_members([alone], X, Y, None, 3, 1)
    assert list(diverged) == [1] and diverged[1].batch == pair[1].batches_ + 1
    np.testing.assert_array_equal(pair[0].network_.W, alone.network_.W)
