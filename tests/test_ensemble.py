"""``SlideEnsemble``: members seeded apart, probabilities averaged, one checkpoint file."""
import numpy as np
import scipy.sparse as sp
import pytest

import slide
from slide.persist.checkpoint import CheckpointError
from slide.ensemble import SlideEnsemble, member_seed
from slide.estimator import SlideClassifier
from slide.warmup import tiny_data

# neighbours=0: the members' probabilities are their softmax (tests/test_neighbours.py has
# an ensemble of members with the vote)
TINY = dict(neighbours=0, hidden_sizes=(8,), L=2, K=2, range_pow=6, sampler_budget=16, shared_negatives=8,
            batch_size=8, epochs=2, n_threads=1)


@pytest.fixture(scope="module")
def data():
    return tiny_data()


@pytest.fixture(scope="module")
def fitted(data):
    return SlideEnsemble(SlideClassifier(**TINY), n_models=3, random_state=5, fused=False).fit(*data)


def softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def test_members_are_seeded_apart_and_differ(fitted):
    seeds = [m.random_state for m in fitted.members_]
    assert seeds == [member_seed(5, k) for k in range(3)] and len(set(seeds)) == 3
    W = [m.network_.W for m in fitted.members_]
    assert not np.array_equal(W[0], W[1]) and not np.array_equal(W[1], W[2])
    assert fitted.train_seconds_ == pytest.approx(sum(m.train_seconds_ for m in fitted.members_))


def test_probabilities_are_the_mean_of_the_members_softmax(fitted, data):
    X, _ = data
    expected = np.mean([softmax(m.predict_scores(X).astype(np.float64))
                        for m in fitted.members_], axis=0)
    got = fitted.predict_proba(X)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-5)


def test_sigmoid_members_average_their_sigmoids(data):
    X, Y = data
    ens = SlideEnsemble(SlideClassifier(**TINY, loss="sigmoid"), n_models=2,
                        random_state=1, fused=False).fit(X, Y)
    expected = np.mean([1 / (1 + np.exp(-m.predict_scores(X).astype(np.float64)))
                        for m in ens.members_], axis=0)
    np.testing.assert_allclose(ens.predict_proba(X), expected, rtol=1e-5, atol=1e-7)


def test_topk_ranks_by_mean_probability(fitted, data, monkeypatch):
    X, Y = data
    p = fitted.predict_proba(X)
    # several blocks of rows must give the same answer as one
    monkeypatch.setattr(slide.ensemble, "_BLOCK_ENTRIES", 7 * fitted.n_labels_)
    top = fitted.predict_topk(X, k=4)
    assert top.shape == (X.shape[0], 4) and top.dtype == np.int64
    rows = np.arange(X.shape[0])[:, None]
    assert np.all(np.diff(p[rows, top], axis=1) <= 0)
    assert np.all(p[rows, top[:, -1:]] >= np.sort(p, axis=1)[:, -4:-3] - 1e-7)
    P = fitted.predict(X, k=4)          # the same top-4 as an indicator matrix
    assert sp.isspmatrix_csr(P) and P.shape == (X.shape[0], fitted.n_labels_)
    np.testing.assert_array_equal(P.toarray().nonzero()[1].reshape(-1, 4), np.sort(top, axis=1))
    hit = np.asarray(Y[np.arange(X.shape[0]), top[:, 0]]).ravel().mean()
    assert fitted.score(X, Y) == pytest.approx(hit)


def test_reproducible_with_a_seed(data, fitted):
    again = SlideEnsemble(SlideClassifier(**TINY), n_models=3, random_state=5, fused=False).fit(*data)
    for a, b in zip(fitted.members_, again.members_):
        np.testing.assert_array_equal(a.network_.W, b.network_.W)


def test_the_default_ensemble_is_two_members_one_after_another(data):
    """``SlideEnsemble()``'s defaults (docs/design.md, "Fused members"): two members, each
    trained and ranked on its own, no stacked ranking."""
    ens = SlideEnsemble(SlideClassifier(**TINY), random_state=0).fit(*data)
    assert len(ens.members_) == 2 and not ens.fused and not hasattr(ens, "rank_")
    assert ens.members_[0].batches_ == ens.members_[1].batches_ > 0


def test_a_stopped_member_resumes_to_the_uninterrupted_ensemble(data, tmp_path):
    """The callback stops member 0 at batch 3 (member 1 still trains); resumed, in this
    process and after a save and load, the ensemble is the one that was never stopped."""
    whole = SlideEnsemble(SlideClassifier(**TINY), n_models=2, random_state=4).fit(*data)
    ens = SlideEnsemble(SlideClassifier(**TINY), n_models=2, random_state=4)
    ens.fit(*data, callback=lambda m, info: info["member"] == 0 and info["batch"] >= 3)
    assert ens.members_[0].stopped_ and ens.members_[0].batches_ == 3
    assert not ens.members_[1].stopped_
    ens.save(tmp_path / "stopped.slide")
    for resumed in (ens, slide.load(tmp_path / "stopped.slide")):
        resumed.fit(*data, resume=True)
        for a, b in zip(resumed.members_, whole.members_):
            assert not getattr(a, "stopped_", False) and a.batches_ == b.batches_
            np.testing.assert_array_equal(a.network_.W, b.network_.W)
        np.testing.assert_array_equal(resumed.predict_topk(data[0], k=3),
                                      whole.predict_topk(data[0], k=3))
    with pytest.raises(ValueError, match="resume needs the ensemble as it was fitted"):
        ens.set_params(n_models=3).fit(*data, resume=True)


def test_seed_falls_back_to_the_estimators(data):
    ens = SlideEnsemble(SlideClassifier(**TINY, random_state=9), n_models=2).fit(*data)
    assert ens.seed_ == 9 and ens.members_[1].random_state == member_seed(9, 1)


def test_time_budget_is_shared_by_the_members(data):
    ens = SlideEnsemble(SlideClassifier(**TINY, time_budget=30.0), n_models=3, random_state=0,
                        fused=False)
    ens.fit(*data)
    assert [m.time_budget for m in ens.members_] == [10.0, 10.0, 10.0]


def test_save_and_load_round_trip(fitted, data, tmp_path):
    X, _ = data
    path = tmp_path / "ens.slide"
    fitted.save(path, extra={"note": "x"})
    from slide.persist import checkpoint
    if not fitted.fused:
        assert checkpoint.read(path)[0]["version"] == checkpoint.FORMAT_VERSION
    back = slide.load(path)
    assert isinstance(back, SlideEnsemble) and back.n_models == 3 and back.extra_ == {"note": "x"}
    assert back.random_state == 5 and back.estimator.hidden_sizes == (8,)
    np.testing.assert_array_equal(back.predict_topk(X, k=3), fitted.predict_topk(X, k=3))
    np.testing.assert_allclose(back.predict_proba(X), fitted.predict_proba(X), rtol=1e-6)


@pytest.mark.parametrize("fused", [False, True])
def test_an_ensemble_saved_without_optimizer_state_predicts_alike(data, tmp_path, fused):
    X, Y = data
    ens = SlideEnsemble(SlideClassifier(**TINY), n_models=2, random_state=1, fused=fused).fit(X, Y)
    path = tmp_path / "small.slide"
    ens.save(path, optimizer_state=False)
    from slide.persist import checkpoint
    meta, arrays = checkpoint.read(path)
    assert meta["version"] == checkpoint.NO_OPTIMIZER_VERSION
    assert not [name for name in arrays if "/opt_" in name]
    back = slide.load(path)
    assert not any(m.optimizer_.has_state for m in back.members_)
    np.testing.assert_array_equal(back.predict_topk(X, k=3), ens.predict_topk(X, k=3))


def test_truncated_ensemble_file_is_refused(fitted, tmp_path):
    path = tmp_path / "ens.slide"
    fitted.save(path)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(CheckpointError, match="ens.slide"):
        slide.load(path)


def test_sklearn_params_and_clone():
    from sklearn.base import clone
    ens = SlideEnsemble(SlideClassifier(learning_rate=3e-3), n_models=2)
    params = ens.get_params(deep=True)
    assert params["estimator__learning_rate"] == 3e-3 and params["n_models"] == 2
    assert clone(ens).estimator.learning_rate == 3e-3


@pytest.mark.parametrize("kw, word", [(dict(n_models=0), "n_models"),
                                      (dict(n_models=2.0), "n_models"),
                                      (dict(random_state=-1), "random_state"),
                                      (dict(estimator="adam"), "estimator"),
                                      (dict(estimator=SlideClassifier(epochs=0)), "epochs")])
def test_bad_parameters_are_named(kw, word, data):
    with pytest.raises(ValueError, match=word):
        SlideEnsemble(**kw).fit(*data)


def test_unfitted_and_sparse_inference_are_refused(fitted, data):
    from sklearn.exceptions import NotFittedError
    with pytest.raises(NotFittedError):
        SlideEnsemble().predict_topk(data[0])
    with pytest.raises(ValueError, match="exact=False"):
        fitted.predict_topk(data[0], exact=False)
    with pytest.raises(ValueError, match="k must be"):
        fitted.predict_topk(data[0], k=0)


def test_bad_ids_and_k_beyond_the_labels_are_refused(fitted, data):
    X = data[0]
    n = fitted.n_labels_
    with pytest.raises(ValueError, match=f"k = {n + 1} is more than the model's n_labels = {n}"):
        fitted.predict_topk(X, k=n + 1)
    row = int(np.flatnonzero(np.diff(X.indptr) > 0)[0])
    ind = X.indices.copy()
    ind[X.indptr[row]] = X.shape[1] + 3
    Xb = sp.csr_matrix((X.data, ind, X.indptr), shape=X.shape)
    for call in (lambda: fitted.predict_topk(Xb, k=2), lambda: fitted.predict_proba(Xb),
                 lambda: fitted.score(Xb, data[1])):
        with pytest.raises(ValueError, match=f"X row {row} has feature id {X.shape[1] + 3}"):
            call()


def test_topk_of_the_mean_breaks_ties_to_the_lower_label_and_survives_nan(fitted, data,
                                                                          monkeypatch):
    X, _ = data
    n_labels = fitted.n_labels_
    p = np.full((X.shape[0], n_labels), 0.5, np.float32)     # every label tied
    p[:, 3] = 0.9
    p[1] = np.nan                                             # a diverged member's row
    p[2, :] = -np.inf
    p[2, 5] = 0.1
    monkeypatch.setattr(SlideEnsemble, "_block_proba", lambda self, Xb: p[:Xb.shape[0]])
    top = fitted.predict_topk(X[:4], k=3)
    assert top[0].tolist() == [3, 0, 1] and top[3].tolist() == [3, 0, 1]
    assert top[2, 0] == 5 and (top >= 0).all()
    assert top[1].tolist() == np.argsort(-p[1], kind="stable")[:3].tolist()
