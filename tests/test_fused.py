"""Fused members (``slide.fused``, ``SlideEnsemble(fused=True)``): one pass over shared batches,
each member trained as it would be alone, one ranking stack on the stacked network."""
import pickle

import numba
import numpy as np
import pytest

import slide
from slide import fused, warmup
from slide.network import block_step
from slide.ensemble import SlideEnsemble, member_seed
from slide.estimator import SlideClassifier
from slide.persist.checkpoint import CheckpointError
from slide.warmup import tiny_data
from tests.test_rerank import SMALL, keyword_data

TINY = dict(hidden_sizes=(8,), L=2, K=2, range_pow=6, sampler_budget=16, shared_negatives=8,
            batch_size=8, epochs=2, n_threads=1)


@pytest.fixture(scope="module")
def data():
    X, Y = tiny_data()
    return X, Y


@pytest.fixture(scope="module")
def fitted(data):
    return SlideEnsemble(SlideClassifier(**TINY, neighbours=0), n_models=3,
                         random_state=5, fused=True).fit(*data)


def test_member_zero_trains_bit_for_bit_as_it_would_alone(data, fitted):
    """Member 0's seed is the ensemble's order of rows: on one thread its network is the one
    ``SlideClassifier.fit`` trains alone with that seed, one batch at a time."""
    alone = SlideClassifier(**TINY, neighbours=0, batches_in_flight=1,
                            random_state=member_seed(5, 0)).fit(*data)
    m0 = fitted.members_[0]
    assert m0.batches_ == alone.batches_ > 0
    np.testing.assert_array_equal(m0.network_.W, alone.network_.W)
    np.testing.assert_array_equal(m0.network_.B, alone.network_.B)


def test_members_do_not_touch_each_other(data, fitted):
    """Member 2 of three trains the same bits as member 2 trained with no other member beside
    it (the same order of rows, its own seed)."""
    X, Y = data
    members = [SlideClassifier(**TINY, neighbours=0, batches_in_flight=1,
                               random_state=member_seed(5, k)) for k in range(3)]
    for m in members:
        hs, sparse = m._checked_params()
        m._build(X.shape[1], Y.shape[1], hs, sparse)
    fused.train_members(members[2:], X, Y, None, fitted.order_seed_, 1)
    np.testing.assert_array_equal(members[2].network_.W, fitted.members_[2].network_.W)
    assert not np.array_equal(fitted.members_[1].network_.W, fitted.members_[2].network_.W)


def test_two_threads_train_every_member_to_a_finite_useful_model(data):
    X, Y = data
    ens = SlideEnsemble(SlideClassifier(**dict(TINY, n_threads=2, epochs=30), neighbours=0),
                        n_models=3, random_state=1, fused=True).fit(X, Y)
    for m in ens.members_:
        assert m.epoch_ == 30 and np.isfinite(m.network_.W).all()
        assert m.train_seconds_ == ens.members_[0].train_seconds_
    # the mean of the members' logits ranks better than the members do on average
    members = np.mean([m.score(X, Y) for m in ens.members_])
    assert ens.score(X, Y) > max(members, 0.3)


def test_stacked_output_is_the_mean_of_the_members_logits(data, fitted):
    X, _ = data
    out = fused.stacked_output(fitted.members_)
    H = fused.stacked_hidden(fitted.members_, X)
    expected = np.mean([m.predict_scores(X).astype(np.float64) for m in fitted.members_], axis=0)
    np.testing.assert_allclose(out.logits(H), expected, rtol=1e-4, atol=1e-5)
    # without the vote the ensemble ranks by those mean logits
    top = fitted.predict_topk(X, k=3)
    np.testing.assert_array_equal(top[:, 0], np.argmax(expected, axis=1))
    np.testing.assert_allclose(fitted.predict_proba(X).sum(axis=1), 1.0, rtol=1e-5)


@pytest.fixture(scope="module")
def reranked():
    """A fused ensemble with the vote and the re-ranker (enough rows to hold some out)."""
    Xtr, Ytr = keyword_data(2400, 0)
    Xte, Yte = keyword_data(300, 1)
    ens = SlideEnsemble(SlideClassifier(epochs=1, **SMALL), n_models=2, fused=True).fit(Xtr, Ytr)
    return ens, Xte, Yte


def test_one_ranking_stack_on_the_stacked_network(reranked):
    ens, Xte, Yte = reranked
    width = sum(m.network_.layout.n_in[-1] for m in ens.members_)
    assert ens.rank_.memory is not None and ens.rank_.memory.fits(width, ens.n_labels_)
    assert ens.rank_.reranker is not None
    assert all(m.rank_.memory is None for m in ens.members_)
    # the re-ranked stacked network ranks at least as well as its members' networks alone
    members = np.mean([m.score(Xte, Yte) for m in ens.members_])
    assert ens.score(Xte, Yte) >= members


def test_save_load_and_pickle_keep_the_predictions(reranked, tmp_path):
    ens, Xte, _ = reranked
    want = ens.predict_topk(Xte, k=3)
    path = tmp_path / "fused.slide"
    ens.save(path)
    # a version a reader of sequential ensembles (6) refuses: it would drop the stacked stages
    from slide.persist import checkpoint
    meta, _ = checkpoint.read(path)
    assert meta["version"] == checkpoint.FUSED_ENSEMBLE_VERSION > checkpoint.FORMAT_VERSION
    back = slide.load(path)
    assert back.fused and back.order_seed_ == ens.order_seed_
    assert back.rank_.reranker is not None
    np.testing.assert_array_equal(back.predict_topk(Xte, k=3), want)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(ens)).predict_topk(Xte, k=3), want)
    np.testing.assert_allclose(back.predict_proba(Xte[:5]), ens.predict_proba(Xte[:5]),
                               rtol=1e-6)
    # the stacked re-ranker's probabilities that ranked them
    ids, scores = back.predict_topk_scored(Xte, k=3)
    np.testing.assert_array_equal(ids, want)
    assert (np.diff(scores, axis=1) <= 0).all() and ((scores > 0) & (scores <= 1)).all()


def test_a_corrupt_fused_ranking_is_refused(data, tmp_path):
    X, Y = data
    ens = SlideEnsemble(SlideClassifier(**TINY, neighbours=4), n_models=2,
                        random_state=3, fused=True).fit(X, Y)
    assert ens.rank_.memory is not None
    path = tmp_path / "fused.slide"
    ens.save(path)
    import zipfile
    bad = tmp_path / "bad.slide"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(bad, "w") as dst:
        for item in src.infolist():
            if not item.filename.startswith("fused/nbr_"):
                dst.writestr(item, src.read(item.filename))
    with pytest.raises(CheckpointError, match="bad.slide"):
        slide.load(bad)


def test_callback_stops_one_member_and_the_others_finish(data):
    X, Y = data
    seen = []

    def stop_member_one(member, info):
        seen.append((info["member"], info["batches"]))
        return info["member"] == 1

    ens = SlideEnsemble(SlideClassifier(**TINY, neighbours=0), n_models=3,
                        random_state=2, fused=True).fit(X, Y, callback=stop_member_one)
    # the tiny set's epoch is one wave: member 1 stopped after its first epoch
    assert ens.members_[1].stopped_ and ens.members_[1].epoch_ == 1
    assert ens.members_[0].epoch_ == ens.members_[2].epoch_ == 2
    assert {k for k, _ in seen} == {0, 1, 2} and all(b >= 1 for _, b in seen)


def test_a_stopped_member_resumes_and_the_ranking_is_fitted(data, tmp_path):
    """Member 1 stopped after the first wave leaves the stacked ranking unfitted; resumed
    after a save and load, the member trains on alone and the ranking is fitted: the ensemble
    that was never stopped, bit for bit on one thread."""
    kw = dict(n_models=2, random_state=6, fused=True)
    whole = SlideEnsemble(SlideClassifier(**TINY, neighbours=4), **kw).fit(*data)
    ens = SlideEnsemble(SlideClassifier(**TINY, neighbours=4), **kw)
    ens.fit(*data, callback=lambda m, info: info["member"] == 1)
    assert ens.members_[1].stopped_ and not ens.rank_.fitted
    ens.save(tmp_path / "stopped.slide")
    back = slide.load(tmp_path / "stopped.slide")
    back.fit(*data, resume=True)
    assert back.rank_.fitted and not back.members_[1].stopped_
    for a, b in zip(back.members_, whole.members_):
        assert a.batches_ == b.batches_
        np.testing.assert_array_equal(a.network_.W, b.network_.W)
    np.testing.assert_array_equal(back.predict_topk(data[0], k=3),
                                  whole.predict_topk(data[0], k=3))


def test_time_budget_is_the_ensembles(data):
    X, Y = data
    ens = SlideEnsemble(SlideClassifier(**dict(TINY, epochs=50), neighbours=0, time_budget=1e-9),
                        n_models=2, random_state=2, fused=True).fit(X, Y)
    # the budget is checked between waves: each member trained the first wave (one epoch)
    assert all(m.budget_spent_ and m.epoch_ == 1 for m in ens.members_)
    # spent, a resumed fit trains no further (as a SlideClassifier's does)
    ens.fit(X, Y, resume=True)
    assert all(m.epoch_ == 1 for m in ens.members_)


def test_bad_fused_flag_and_mismatched_members_are_named(data):
    with pytest.raises(ValueError, match="fused must be True or False"):
        SlideEnsemble(SlideClassifier(**TINY), fused="yes").fit(*data)
    a, b = SlideClassifier(**TINY), SlideClassifier(**dict(TINY, batch_size=16))
    with pytest.raises(ValueError, match="batch_size.*member 1"):
        fused.train_members([a, b], *data, None, 0, 1)
    with pytest.raises(ValueError, match="loss.*member 1"):
        fused.check_agree([a, SlideClassifier(**dict(TINY, loss="sigmoid"))])


@pytest.mark.parametrize("kind", ["ensemble", "search", "halving search"])
def test_the_warm_up_compiles_the_build_the_pass_runs(data, monkeypatch, kind):
    """Two members on two threads run their batches on one thread each, so the batch's
    one-thread build (``block_step.run_batch``): the warm-up must key and compile that build,
    not the parallel one, else the pass compiles it inside its clock. A halving search's last
    trial trains on alone as its own fit does, two batches in flight on one thread each: the
    same build."""
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs two threads")
    keys, threads_a_batch = [], []
    real_warm_up, real_run = warmup.warm_up, block_step.run_batch

    def recording_warm_up(model, X=None, Y=None, then=()):
        keys.append(warmup.config_key(model))
        return real_warm_up(model, X, Y, then)

    def recording_run(call):
        threads_a_batch.append(int(call.sched.n_threads))
        return real_run(call)

    monkeypatch.setattr(warmup, "warm_up", recording_warm_up)
    monkeypatch.setattr(block_step, "run_batch", recording_run)
    template = SlideClassifier(**dict(TINY, n_threads=2), neighbours=0, random_state=1)
    grid = {"learning_rate": [1e-3, 1e-2]}
    if kind == "ensemble":
        SlideEnsemble(template, n_models=2, random_state=1, fused=True).fit(*data)
    elif kind == "search":
        slide.SlideSearch(template, param_grid=grid, factor=None).fit(*data)
    else:
        slide.SlideSearch(template, param_grid=grid, factor=2).fit(*data)
    # the key's first entry: the builds a fit takes (True: one thread a batch)
    builds = set().union(*(key[0] for key in keys))
    assert threads_a_batch and set(threads_a_batch) == {1} and builds == {True}
    assert numba.get_num_threads() == 2         # the warm-up's share did not stay set
