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
