"""``predict`` follows scikit-learn's multi-label convention (issue 59): a
``scipy.sparse.csr_matrix`` (n_samples, n_labels) of 0/1 holding each row's top-k labels of
``predict_topk``, its columns ordered as ``classes_``; a model fitted on a 1-D ``y`` answers
with a 1-D array of names, as scikit-learn's classifiers answer such a target. The ranking
API, ``predict_topk``, is unchanged."""
import json
import pickle

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.metrics import accuracy_score, f1_score, precision_score
from sklearn.preprocessing import MultiLabelBinarizer

import slide
from slide import labels
from slide.ensemble import SlideEnsemble
from slide.estimator import SlideClassifier

SMALL = dict(hidden_sizes=(16,), batch_size=32, epochs=2, n_threads=1, random_state=0)
# an ensemble without the vote (its members' top-k by mean probability): fast to fit
ENSEMBLE = dict(SMALL, neighbours=0)


@pytest.fixture(scope="module")
def fitted(tiny):
    Xtr, Ytr, _, _ = tiny
    return SlideClassifier(**SMALL).fit(Xtr, Ytr)


def first_labels(Y, names):
    """A 1-D y: the first label of each row of the CSR ``Y``, as ``names`` calls it."""
    Y = sp.csr_matrix(Y)
    keep = np.diff(Y.indptr) > 0
    return keep, np.asarray(names)[Y.indices[Y.indptr[:-1][keep]]]


def assert_topk_indicator(P, ids, n_labels):
    """``P`` is the indicator matrix of the (n, k) ranked ``ids``."""
    n, k = ids.shape
    assert type(P) is sp.csr_matrix and P.dtype == np.int8 and P.shape == (n, n_labels)
    assert P.has_sorted_indices and np.all(P.data == 1)
    np.testing.assert_array_equal(P.getnnz(axis=1), np.full(n, k))
    np.testing.assert_array_equal(P.indices.reshape(n, k), np.sort(ids, axis=1))


def test_indicator_drops_padding_and_sorts_columns():
    P = labels.indicator(np.array([[3, 1], [2, -1], [-1, -1]]), 5)
    assert type(P) is sp.csr_matrix and P.dtype == np.int8 and P.has_sorted_indices
    np.testing.assert_array_equal(P.toarray(), [[0, 1, 0, 1, 0], [0, 0, 1, 0, 0], [0] * 5])


@pytest.mark.parametrize("k", [1, 3])
def test_predict_is_predict_topk_as_an_indicator_matrix(fitted, tiny, k):
    Xte = tiny[2]
    P = fitted.predict(Xte, k=k)
    assert_topk_indicator(P, fitted.predict_topk(Xte, k=k), fitted.n_labels_)
    if k == 1:      # the default
        assert (fitted.predict(Xte) != P).nnz == 0


def test_predict_checks_k(fitted, tiny):
    for bad in (0, fitted.n_labels_ + 1, 1.5):
        with pytest.raises(ValueError, match="k"):
            fitted.predict(tiny[2], k=bad)


def test_scikit_learns_metrics_take_the_prediction(fitted, tiny):
    _, _, Xte, Yte = tiny
    P = fitted.predict(Xte, k=2)
    Yte = sp.csr_matrix(Yte)
    tp = Yte.multiply(P).sum()
    expected = 2 * tp / (Yte.nnz + P.nnz)
    assert f1_score(Yte, P, average="micro") == pytest.approx(expected)
    assert f1_score(Yte.toarray().astype(int), P, average="micro") == pytest.approx(expected)
    # one label a row: the per-row precision is the top label's hit, i.e. score's P@1
    assert precision_score(Yte, fitted.predict(Xte), average="samples",
                           zero_division=0) == pytest.approx(fitted.score(Xte, Yte))


def test_columns_are_classes_for_a_model_fitted_on_names(tiny):
    Xtr, Ytr, Xte, _ = tiny
    Ytr = sp.csr_matrix(Ytr)
    n = Ytr.shape[1]
    # names whose sorted order is not the ids' order, so a column mix-up shows
    names = np.array([f"label-{(j * 37) % n:03d}" for j in range(n)])
    lists = [list(names[Ytr.indices[a:b]]) for a, b in zip(Ytr.indptr[:-1], Ytr.indptr[1:])]
    m = SlideClassifier(**SMALL).fit(Xtr, lists)
    assert m.named_labels_ and m.classes_.tolist() == sorted(set(names[np.unique(Ytr.indices)]))
    P = m.predict(Xte, k=3)
    top = m.predict_topk(Xte, k=3, return_names=True)
    assert P.shape == (Xte.shape[0], len(m.classes_))
    back = MultiLabelBinarizer(classes=m.classes_).fit([]).inverse_transform(P)
    assert [sorted(r) for r in back] == [sorted(r) for r in top.tolist()]
    np.testing.assert_array_equal(m.classes_[m.predict(Xte).indices], top[:, 0])
    # a 0/1 matrix with classes= in an order of the caller's: the columns keep that order
    order = list(names[::-1])
    m2 = SlideClassifier(**SMALL).fit(Xtr, Ytr, classes=order)
    assert m2.classes_.tolist() == order
    np.testing.assert_array_equal(np.asarray(order)[m2.predict(Xte).indices],
                                  m2.predict_topk(Xte, k=1, return_names=True)[:, 0])


def test_a_1d_y_predicts_a_1d_array_as_scikit_learn_classifiers_do(tiny, tmp_path):
    Xtr, Ytr, Xte, Yte = tiny
    keep, y = first_labels(Ytr, [f"c{j}" for j in range(Ytr.shape[1])])
    m = SlideClassifier(**SMALL).fit(Xtr[keep], y)
    p = m.predict(Xte)
    assert isinstance(p, np.ndarray) and p.shape == (Xte.shape[0],)
    np.testing.assert_array_equal(p, m.predict_topk(Xte, k=1, return_names=True)[:, 0])
    keep_te, y_te = first_labels(Yte, [f"c{j}" for j in range(Yte.shape[1])])
    assert 0.0 <= accuracy_score(y_te, p[keep_te]) <= 1.0
    with pytest.raises(ValueError, match="1-D y.*k must be 1"):
        m.predict(Xte, k=2)
    # the target's form travels with the model
    m.save(tmp_path / "m.slide")
    np.testing.assert_array_equal(slide.load(tmp_path / "m.slide").predict(Xte), p)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(m)).predict(Xte), p)
    # a fresh fit on a multi-label Y answers with the indicator matrix again
    assert sp.issparse(m.fit(Xtr, Ytr).predict(Xte))


def test_a_checkpoint_without_the_flag_loads_as_multi_label(tiny, tmp_path):
    Xtr, Ytr, Xte, _ = tiny
    keep, y = first_labels(Ytr, np.arange(Ytr.shape[1]))
    m = SlideClassifier(**SMALL).fit(Xtr[keep], y)
    path = tmp_path / "m.slide"
    m.save(path)
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays["__meta__"].tobytes().decode())
    assert meta.pop("one_label_per_row") is True
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with open(path, "wb") as f:          # a file written before predict's change
        np.savez(f, **arrays)
    P = slide.load(path).predict(Xte)
    assert sp.issparse(P)
    np.testing.assert_array_equal(m.classes_[P.indices], m.predict(Xte))


def test_an_ensemble_predicts_the_same_way(tiny, tmp_path):
    Xtr, Ytr, Xte, _ = tiny
    ens = SlideEnsemble(SlideClassifier(**ENSEMBLE), n_models=2, random_state=0).fit(Xtr, Ytr)
    assert_topk_indicator(ens.predict(Xte, k=2), ens.predict_topk(Xte, k=2), ens.n_labels_)
    keep, y = first_labels(Ytr, [f"c{j}" for j in range(Ytr.shape[1])])
    ens1 = SlideEnsemble(SlideClassifier(**ENSEMBLE), n_models=2, random_state=0).fit(
        Xtr[keep], y)
    p = ens1.predict(Xte)
    assert p.shape == (Xte.shape[0],)
    np.testing.assert_array_equal(p, ens1.predict_topk(Xte, k=1, return_names=True)[:, 0])
    with pytest.raises(ValueError, match="k must be 1"):
        ens1.predict(Xte, k=3)
    ens1.save(tmp_path / "e.slide")
    np.testing.assert_array_equal(slide.load(tmp_path / "e.slide").predict(Xte), p)


def test_a_sharded_model_predicts_the_same_way(tiny, tmp_path):
    from slide.distributed import ShardedSlideClassifier
    from slide.distributed.convert import to_single
    Xtr, Ytr, Xte, _ = tiny
    keep, y = first_labels(Ytr, [f"c{j}" for j in range(Ytr.shape[1])])
    sh = ShardedSlideClassifier(n_shards=2, backend="local", neighbours=0, **SMALL)
    try:
        sh.fit(Xtr[keep], y)
        p = sh.predict(Xte)
        assert p.shape == (Xte.shape[0],)
        np.testing.assert_array_equal(p, sh.predict_topk(Xte, k=1, return_names=True)[:, 0])
        np.testing.assert_array_equal(to_single(sh).predict(Xte), p)
        sh.save(tmp_path / "sharded")
        back = slide.load(tmp_path / "sharded")
        try:
            np.testing.assert_array_equal(back.predict(Xte), p)
        finally:
            back.close()
        sh.fit(Xtr, Ytr)
        assert_topk_indicator(sh.predict(Xte, k=2), sh.predict_topk(Xte, k=2), sh.n_labels_)
    finally:
        sh.close()
