"""Named labels in and out (slide.labels), scikit-learn pipelines over raw text (slide.text),
pickling, and the names through save/load, checkpoints, resume, ensembles and shards."""
import pickle

import joblib
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.feature_extraction.text import HashingVectorizer, TfidfTransformer, TfidfVectorizer
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import MultiLabelBinarizer

import slide
from slide import labels

SMALL = dict(hidden_sizes=(32,), batch_size=32, epochs=4, n_threads=1, random_state=0)
TOPICS = {"db": "sql query table index join", "web": "http html server browser cookie",
          "math": "matrix algebra solver numeric vector", "audio": "sound codec mp3 player mixer",
          "game": "level sprite joystick arcade puzzle"}


def corpus(n, seed):
    """Documents of two topics' words each, labelled with the two topics' names."""
    rng = np.random.default_rng(seed)
    names = sorted(TOPICS)
    docs, Y = [], []
    for _ in range(n):
        a, b = rng.choice(len(names), 2, replace=False)
        words = (list(rng.choice(TOPICS[names[a]].split(), 3))
                 + list(rng.choice(TOPICS[names[b]].split(), 2)) + ["package"])
        docs.append(" ".join(rng.permutation(words)))
        Y.append([f"topic/{names[a]}", f"topic/{names[b]}"])
    return docs, Y


@pytest.fixture(scope="module")
def text():
    return corpus(400, 0) + corpus(60, 1)


def tfidf_pipe(**kw):
    return make_pipeline(TfidfVectorizer(sublinear_tf=True),
                         slide.SlideClassifier(**dict(SMALL, **kw)))


def hashing_pipe(**kw):
    return make_pipeline(HashingVectorizer(n_features=2**12, alternate_sign=False, norm=None),
                         TfidfTransformer(sublinear_tf=True),
                         slide.SlideClassifier(**dict(SMALL, **kw)))


# ---------------------------------------------------------------------------------------------
# the rule: ids or names

def test_integer_label_lists_stay_ids_and_strings_become_sorted_names():
    M, names = labels.encode([[0, 4], [2]])
    assert names is None and M.shape == (2, 5)          # ids: 0 .. largest id
    M, names = labels.encode([["b", "a"], ["c"]])
    assert names.tolist() == ["a", "b", "c"]
    np.testing.assert_array_equal(M.toarray(), [[1, 1, 0], [0, 0, 1]])
    M, names = labels.encode([[10, 30]], classes=[30, 20, 10])   # explicit: ints are names
    assert names.tolist() == [30, 20, 10] and M.toarray().tolist() == [[1, 0, 1]]
    M, names = labels.encode(np.array(["x", "y", "x"]))           # 1-D y: scikit-learn's rule
    assert names.tolist() == ["x", "y"] and M.toarray().tolist() == [[1, 0], [0, 1], [1, 0]]
    M, names = labels.encode([3, 1])                              # a list of single ids
    assert names is None and M.shape == (2, 4)
    with pytest.raises(ValueError, match="classes has repeated names"):
        labels.encode([["a"]], classes=["a", "a"])
    with pytest.raises(ValueError, match=r"Y\[1\] has the label 'z'"):
        labels.encode([["a"], ["z"]], classes=["a", "b"])


def test_id_model_is_unchanged_and_names_come_back(tiny):
    Xtr, Ytr, Xte, _ = tiny
    m = slide.SlideClassifier(**SMALL).fit(Xtr, Ytr)
    assert not m.named_labels_ and np.array_equal(m.classes_, np.arange(Ytr.shape[1]))
    ids = m.predict_topk(Xte, k=3)
    np.testing.assert_array_equal(m.predict_topk(Xte, k=3, return_names=True), ids)
    np.testing.assert_array_equal(m.predict(Xte).indices, ids[:, 0])    # columns: classes_


def test_multilabelbinarizer_input_and_name_lists_train_the_same_model(text):
    docs, Y = text[0], text[1]
    X = TfidfVectorizer().fit_transform(docs)
    mlb = MultiLabelBinarizer()
    B = mlb.fit_transform(Y)
    a = slide.SlideClassifier(**SMALL).fit(X, B, classes=mlb.classes_)
    b = slide.SlideClassifier(**SMALL).fit(X, Y)
    assert a.classes_.tolist() == b.classes_.tolist() == sorted({v for r in Y for v in r})
    np.testing.assert_array_equal(a.predict_topk(X, 2), b.predict_topk(X, 2))
    assert (a.predict(X, k=2) != b.predict(X, k=2)).nnz == 0
    with pytest.raises(ValueError, match="label columns"):
        slide.SlideClassifier(**SMALL).fit(X, B, classes=list(mlb.classes_) + ["extra"])


# ---------------------------------------------------------------------------------------------
# pipelines

@pytest.mark.parametrize("make", [tfidf_pipe, hashing_pipe])
def test_pipeline_fits_predicts_scores_and_round_trips(text, make, tmp_path):
    docs, Y, docs_te, Y_te = text
    pipe = make().fit(docs, Y)
    assert pipe.score(docs_te, Y_te) >= 0.9           # top-1 is one of the row's two topics
    top = pipe[-1].predict_topk(pipe[:-1].transform(docs_te), k=2, return_names=True)
    hits = np.mean([set(t) == set(y) for t, y in zip(top, Y_te)])
    assert hits >= 0.8, hits
    pred = pipe.predict(docs_te).toarray()
    joblib.dump(pipe, tmp_path / "p.joblib")
    np.testing.assert_array_equal(joblib.load(tmp_path / "p.joblib").predict(docs_te).toarray(),
                                  pred)
    slide.save(pipe, tmp_path / "p.slide")
    back = slide.load(tmp_path / "p.slide")
    assert [type(s).__name__ for _, s in back.steps] == [type(s).__name__ for _, s in pipe.steps]
    np.testing.assert_array_equal(back.predict(docs_te).toarray(), pred)
    np.testing.assert_array_equal(back[:-1].transform(docs_te).toarray(),
                                  pipe[:-1].transform(docs_te).toarray())


def test_unseen_names_are_refused_at_score_and_partial_fit(text):
    docs, Y = text[0], text[1]
    pipe = tfidf_pipe().fit(docs, Y)
    with pytest.raises(ValueError, match=r"Y\[1\] has the label 'topic/space'.*classes_"):
        pipe.score(docs[:2], [Y[0], ["topic/space"]])
    X = pipe[0].transform(docs)
    m = pipe[-1]
    with pytest.raises(ValueError, match="'topic/space'"):
        m.partial_fit(X[:2], [Y[0], ["topic/space"]])
    before = m.batches_
    m.partial_fit(X[:64], Y[:64])                       # known names: trains on
    assert m.batches_ > before


def test_partial_fit_takes_every_name_from_classes():
    docs, Y = corpus(200, 3)
    X = TfidfVectorizer().fit(docs).transform(docs)
    every = sorted({v for r in Y for v in r}) + ["topic/unused"]
    m = slide.SlideClassifier(**SMALL).partial_fit(X[:100], Y[:100], classes=every)
    assert m.classes_.tolist() == every and m.n_labels_ == len(every)
    m.partial_fit(X[100:], Y[100:])
    assert m.predict_topk(X, k=len(every), return_names=True).shape == (200, len(every))


def test_a_fitted_classifier_pickles_bit_exact(text):
    docs, Y = text[0], text[1]
    X = TfidfVectorizer().fit_transform(docs)
    m = slide.SlideClassifier(**SMALL).fit(X, Y)
    m2 = pickle.loads(pickle.dumps(m))
    np.testing.assert_array_equal(m2.network_.W, m.network_.W)
    np.testing.assert_array_equal(m2.predict_topk_scored(X, 3)[1], m.predict_topk_scored(X, 3)[1])
    assert m2.classes_.tolist() == m.classes_.tolist() and m2.get_params() == m.get_params()
    assert pickle.loads(pickle.dumps(slide.SlideClassifier(hidden_sizes=(8,)))).hidden_sizes \
        == (8,)


def test_text_model_predicts_the_same_names_after_save_and_load(text, tmp_path):
    docs, Y, docs_te, _ = text
    pipe = tfidf_pipe().fit(docs, Y)
    before = pipe[-1].predict_topk(pipe[0].transform(docs_te), k=3, return_names=True)
    slide.save(pipe, tmp_path / "m.slide")
    back = slide.load(tmp_path / "m.slide")
    after = back[-1].predict_topk(back[0].transform(docs_te), k=3, return_names=True)
    np.testing.assert_array_equal(after, before)
    assert after.dtype.kind == "U"


def test_callables_are_refused_by_slides_format(text, tmp_path):
    docs, Y = text[0], text[1]
    pipe = make_pipeline(TfidfVectorizer(tokenizer=str.split, token_pattern=None),
                         slide.SlideClassifier(**SMALL)).fit(docs, Y)
    with pytest.raises(ValueError, match="tokenizer is a callable.*joblib"):
        slide.save(pipe, tmp_path / "m.slide")
    assert not (tmp_path / "m.slide").exists()


# ---------------------------------------------------------------------------------------------
# names through checkpoints, resume, ensembles and shards

def test_names_survive_checkpoints_and_resume(text, tmp_path):
    docs, Y = text[0], text[1]
    X = TfidfVectorizer().fit_transform(docs)
    whole = slide.SlideClassifier(**SMALL).fit(X, Y)
    m = slide.SlideClassifier(**SMALL)
    m.fit(X, Y, callback=lambda model, info: info["batch"] == 20)
    m.save(tmp_path / "c.slide")
    resumed = slide.load(tmp_path / "c.slide")
    assert resumed.classes_.tolist() == whole.classes_.tolist() and resumed.named_labels_
    resumed.fit(X, Y, resume=True)
    np.testing.assert_array_equal(resumed.predict(X).toarray(), whole.predict(X).toarray())
    with pytest.raises(ValueError, match="'topic/space'"):
        slide.load(tmp_path / "c.slide").fit(X[:2], [["topic/space"], []], resume=True)


def test_names_survive_an_ensemble(text, tmp_path):
    docs, Y, docs_te, _ = text
    vec = TfidfVectorizer().fit(docs)
    X, Xte = vec.transform(docs), vec.transform(docs_te)
    ens = slide.SlideEnsemble(slide.SlideClassifier(**SMALL), n_models=2,
                              random_state=0).fit(X, Y)
    assert ens.classes_.tolist() == sorted({v for r in Y for v in r})
    assert all(m.classes_.tolist() == ens.classes_.tolist() for m in ens.members_)
    names = ens.predict_topk(Xte, k=2, return_names=True)
    assert set(names.ravel()) <= set(ens.classes_)
    ens.save(tmp_path / "e.slide")
    back = slide.load(tmp_path / "e.slide")
    np.testing.assert_array_equal(back.predict(Xte, k=2).toarray(),
                                  ens.predict(Xte, k=2).toarray())
    assert 0.0 <= back.score(Xte, text[3]) <= 1.0
    with pytest.raises(ValueError, match="'topic/space'"):
        back.score(Xte[:1], [["topic/space"]])


def test_names_survive_a_sharded_model(text, tmp_path):
    from slide.distributed import ShardedSlideClassifier
    from slide.distributed.convert import to_single
    docs, Y = text[0], text[1]
    X = TfidfVectorizer().fit_transform(docs)
    sh = ShardedSlideClassifier(n_shards=2, backend="local", neighbours=0, **SMALL).fit(X, Y)
    try:
        assert sh.named_labels_ and sh.classes_.tolist() == sorted({v for r in Y for v in r})
        pred = sh.predict(X, k=2)
        assert pred.shape == (X.shape[0], len(sh.classes_))
        np.testing.assert_array_equal(pred.indices.reshape(-1, 2),
                                      np.sort(sh.predict_topk(X, k=2), axis=1))
        sh.save(tmp_path / "sharded")
        back = slide.load(tmp_path / "sharded")
        try:
            np.testing.assert_array_equal(back.predict(X, k=2).toarray(), pred.toarray())
            single = to_single(back)
            assert single.classes_.tolist() == sh.classes_.tolist()
        finally:
            back.close()
    finally:
        sh.close()


def test_an_ensemble_pickles_and_slide_save_takes_any_model(text, tmp_path):
    docs, Y, docs_te, _ = text
    vec = TfidfVectorizer().fit(docs)
    X, Xte = vec.transform(docs), vec.transform(docs_te)
    ens = slide.SlideEnsemble(slide.SlideClassifier(**SMALL), n_models=2,
                              random_state=1).fit(X, Y)
    back = joblib.load(_dump(ens, tmp_path / "e.joblib"))
    np.testing.assert_array_equal(back.predict_topk(Xte, 3), ens.predict_topk(Xte, 3))
    slide.save(ens, tmp_path / "e.slide")          # not a pipeline: the object's own save
    np.testing.assert_array_equal(slide.load(tmp_path / "e.slide").predict(Xte).toarray(),
                                  ens.predict(Xte).toarray())


def test_a_text_pipeline_ending_in_an_ensemble_saves_as_one_file(text, tmp_path):
    docs, Y, docs_te, _ = text
    pipe = make_pipeline(TfidfVectorizer(sublinear_tf=True),
                         slide.SlideEnsemble(slide.SlideClassifier(**SMALL), n_models=2,
                                             random_state=2)).fit(docs, Y)
    before = pipe[-1].predict_topk(pipe[0].transform(docs_te), k=3, return_names=True)
    for name, options in (("full.slide", {}), ("serve.slide", {"optimizer_state": False})):
        slide.save(pipe, tmp_path / name, **options)
        back = slide.load(tmp_path / name)
        assert [n for n, _ in back.steps] == [n for n, _ in pipe.steps]
        assert isinstance(back[-1], slide.SlideEnsemble)
        np.testing.assert_array_equal(
            back[-1].predict_topk(back[0].transform(docs_te), k=3, return_names=True), before)
        np.testing.assert_array_equal(back.predict(docs_te).toarray(),
                                      pipe.predict(docs_te).toarray())
    assert (tmp_path / "serve.slide").stat().st_size < (tmp_path / "full.slide").stat().st_size


def test_a_text_pipeline_ending_in_a_sharded_model_is_refused_by_name(text, tmp_path):
    from slide.distributed import ShardedSlideClassifier
    docs, Y = text[0], text[1]
    pipe = make_pipeline(TfidfVectorizer(), ShardedSlideClassifier(
        n_shards=2, backend="local", neighbours=0, **SMALL)).fit(docs, Y)
    try:
        with pytest.raises(ValueError, match="sharded model saves into a directory.*to_single"):
            slide.save(pipe, tmp_path / "m.slide")
        assert not (tmp_path / "m.slide").exists()
    finally:
        pipe[-1].close()


def _dump(obj, path):
    joblib.dump(obj, path)
    return path


def test_names_slide_cannot_write_are_refused_by_save_not_by_fit(tmp_path):
    X = np.eye(4, dtype=np.float32)
    Y = [[("a", 1)], [("b", 2)], [("a", 1)], [("b", 2)]]
    m = slide.SlideClassifier(**SMALL).fit(X, Y)
    assert m.predict(X).shape == (4, 2) and set(map(tuple, m.classes_)) == {("a", 1), ("b", 2)}
    with pytest.raises(ValueError, match=r"label name \('a', 1\).*cannot be saved"):
        m.save(tmp_path / "m.slide")
    assert (pickle.loads(pickle.dumps(m)).predict(X) != m.predict(X)).nnz == 0


def test_a_matrix_with_classes_and_a_refit_with_other_classes(text):
    docs, Y = text[0], text[1]
    X = TfidfVectorizer().fit_transform(docs)
    mlb = MultiLabelBinarizer().fit(Y)
    B = sp.csr_matrix(mlb.transform(Y))
    m = slide.SlideClassifier(**SMALL).fit(X, B, classes=list(mlb.classes_))
    assert m.named_labels_ and m.classes_.tolist() == list(mlb.classes_)
    with pytest.raises(ValueError, match="classes differs"):
        m.partial_fit(X, Y, classes=list(mlb.classes_)[::-1])
    ids = slide.SlideClassifier(**SMALL).fit(X, B)            # no classes: ids
    assert not ids.named_labels_ and ids.predict_topk(X, 1, return_names=True).dtype.kind == "i"
