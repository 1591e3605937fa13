"""Tests of slide.synthetic: determinism, shapes and per-point means, long-tailed labels,
normalisation, overrides, file output, and learnability of the ``tiny`` preset."""
import numpy as np
import pytest
import scipy.sparse as sp

from slide import synthetic as S
from slide.metrics import precision_at_k


def _same(a, b):
    return (a.shape == b.shape and np.array_equal(a.indptr, b.indptr)
            and np.array_equal(a.indices, b.indices) and np.array_equal(a.data, b.data))


def test_deterministic_for_a_seed_and_seeds_differ(tiny):
    again = S.generate("tiny", seed=0)
    assert all(_same(a, b) for a, b in zip(tiny, again))
    other = S.generate("tiny", seed=1)
    assert not _same(tiny[0], other[0]) and not _same(tiny[1], other[1])


def test_canonical_csr_output(tiny):
    Xtr, Ytr, Xte, Yte = tiny
    p = S.PRESETS["tiny"]
    assert Xtr.shape == (p["n_train"], p["n_features"]) and Xte.shape == (p["n_test"], p["n_features"])
    assert Ytr.shape == (p["n_train"], p["n_labels"]) and Yte.shape == (p["n_test"], p["n_labels"])
    for M in tiny:
        assert sp.isspmatrix_csr(M) and M.dtype == np.float32 and M.indices.dtype == np.int32
        for i in range(M.shape[0]):          # strictly increasing column ids in every row
            assert np.all(np.diff(M.indices[M.indptr[i]:M.indptr[i + 1]]) > 0)
    for Y in (Ytr, Yte):
        assert np.all(Y.data == 1.0)
        assert np.diff(Y.indptr).min() >= 1          # every point has at least one label
    for X in (Xtr, Xte):
        assert np.all(X.data > 0) and np.all(np.isfinite(X.data))
        norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
        np.testing.assert_allclose(norms, 1.0, rtol=1e-5)


@pytest.mark.parametrize("preset,scale", [("amazon670k", 0.01), ("eurlex-4k", 0.1),
                                          ("xc200k", 0.02), ("wiki10-31k", 0.05)])
def test_shapes_and_means_follow_the_preset(preset, scale):
    p = S.PRESETS[preset]
    Xtr, Ytr, Xte, Yte = S.generate(preset, scale=scale, seed=3)
    assert Xtr.shape == (round(p["n_train"] * scale), round(p["n_features"] * scale))
    assert Ytr.shape == (round(p["n_train"] * scale), round(p["n_labels"] * scale))
    assert Xte.shape[0] == round(p["n_test"] * scale)
    # per-point means are never scaled; the generator calibrates them on a pilot sample
    assert Xtr.nnz / Xtr.shape[0] == pytest.approx(p["avg_nnz"], rel=0.08)
    assert Ytr.nnz / Ytr.shape[0] == pytest.approx(p["avg_labels"], rel=0.08)
    assert Xte.nnz / Xte.shape[0] == pytest.approx(p["avg_nnz"], rel=0.1)
    assert Yte.nnz / Yte.shape[0] == pytest.approx(p["avg_labels"], rel=0.1)


def test_label_frequencies_are_long_tailed():
    # Amazon-670K's shape at 5% (33.5k labels, 24.5k points): ~4 training points per label
    Xtr, Ytr, _, _ = S.generate("amazon670k", scale=0.05, seed=0)
    freq = np.sort(np.bincount(Ytr.indices, minlength=Ytr.shape[1]))[::-1]
    top1 = freq[: len(freq) // 100].sum() / freq.sum()
    assert top1 > 0.15                       # the top 1% of labels hold a large share
    assert np.median(freq) <= 2              # the median label has very few points
    assert (freq == 0).mean() > 0.1          # and some labels never occur in training
    assert freq[0] > 50 * max(1, np.median(freq))
    # a Zipf law: log frequency falls roughly linearly in log rank over the body of the curve
    r = np.arange(10, 2000)
    slope = np.polyfit(np.log(r + 1), np.log(freq[r]), 1)[0]
    assert -1.6 < slope < -0.5


def test_labels_co_occur_within_clusters():
    # pairs of labels of one point share a cluster far more often than random pairs would
    p = S.preset_params("amazon670k", scale=0.02)
    model = S._Model(p, seed=0)
    _, Y, _, _ = S.generate("amazon670k", scale=0.02, seed=0)
    c = model.cluster
    same = total = 0
    for i in range(2000):
        labs = Y.indices[Y.indptr[i]:Y.indptr[i + 1]]
        if len(labs) > 1:
            same += int((c[labs[1:]] == c[labs[0]]).sum())
            total += len(labs) - 1
    n_clusters = c.max() + 1
    assert same / total > 10.0 / n_clusters and same / total > 0.2


def test_scale_and_overrides():
    Xtr, Ytr, Xte, Yte = S.generate("amazon670k", seed=0, n_train=300, n_test=50, n_features=2000)
    assert Xtr.shape == (300, 2000) and Ytr.shape == (300, 670_091)    # all labels kept
    assert Xte.shape == (50, 2000)
    # overriding n_train leaves the test split unchanged (independent random streams)
    _, _, Xte2, Yte2 = S.generate("amazon670k", seed=0, n_train=200, n_test=50, n_features=2000)
    assert _same(Yte, Yte2)
    # scale, then override
    X, Y, _, _ = S.generate("tiny", scale=2.0, n_test=10, avg_nnz=20.0)
    assert X.shape == (1200, 3000) and Y.shape[1] == 400
    assert X.nnz / X.shape[0] == pytest.approx(20.0, rel=0.1)


def test_bad_parameters_raise_value_errors():
    with pytest.raises(ValueError, match="unknown preset"):
        S.generate("nope")
    with pytest.raises(ValueError, match="unknown generator parameter"):
        S.generate("tiny", n_trian=5)
    with pytest.raises(ValueError, match="scale"):
        S.generate("tiny", scale=0)
    with pytest.raises(ValueError, match="avg_nnz"):
        S.generate("tiny", avg_nnz=10_000.0)
    with pytest.raises(ValueError, match="n_train"):
        S.generate("tiny", n_train=0)
    with pytest.raises(ValueError, match="frac_signal"):
        S.generate("tiny", frac_signal=0.8, frac_topic=0.5)
    with pytest.raises(ValueError, match="seed"):
        S.generate("tiny", seed=-1)


def test_all_presets_have_the_public_shapes():
    P = S.PRESETS
    assert (P["amazon670k"]["n_features"], P["amazon670k"]["n_labels"], P["amazon670k"]["n_train"],
            P["amazon670k"]["n_test"]) == (135_909, 670_091, 490_449, 153_025)
    assert (P["delicious200k"]["n_features"], P["delicious200k"]["n_labels"],
            P["delicious200k"]["n_train"], P["delicious200k"]["n_test"]) == (782_585, 205_443, 196_606, 100_095)
    assert (P["wiki10-31k"]["n_labels"], P["eurlex-4k"]["n_labels"]) == (30_938, 3_993)
    assert (P["xc200k"]["n_features"], P["xc200k"]["n_labels"], P["xc200k"]["n_train"]) == (100_000, 200_000, 100_000)
    for name, p in P.items():
        # every preset generates at a small scale (features kept above 4x the nonzeros per point)
        scale = 1.0 if name == "tiny" else max(0.002, 4 * p["avg_nnz"] / p["n_features"])
        X, Y, _, _ = S.generate(name, scale=scale, n_train=50, n_test=5)
        assert X.shape[0] == 50 and Y.shape[1] == round(p["n_labels"] * scale)
        assert np.diff(Y.indptr).min() >= 1


def test_learnable_but_not_trivial(tiny):
    """A per-label centroid classifier (cosine) learns ``tiny`` far better than predicting the most
    frequent label, and far from perfectly (the figures are in datasets/README.md)."""
    Xtr, Ytr, Xte, Yte = tiny
    C = (Ytr.T @ Xtr).toarray()
    C /= np.maximum(np.linalg.norm(C, axis=1, keepdims=True), 1e-12)
    scores = Xte @ C.T
    top = np.argsort(-scores, axis=1, kind="stable")[:, :5]
    p1 = precision_at_k(Yte, top, 1)
    most = np.argsort(-np.bincount(Ytr.indices, minlength=Ytr.shape[1]), kind="stable")[:5]
    p1_base = precision_at_k(Yte, np.tile(most, (Xte.shape[0], 1)), 1)
    assert p1_base < 0.12
    assert p1 > 4 * p1_base and p1 > 0.3
    assert p1 < 0.85


def test_write_dataset_round_trip(tmp_path, tiny):
    Xtr, Ytr, Xte, Yte = (M[:40] for M in tiny)
    paths = S.write_dataset(tmp_path / "d", Xtr, Ytr, Xte, Yte)
    assert [p.rsplit("/", 1)[-1] for p in map(str, paths)] == ["train.txt", "test.txt"]
    with open(paths[0]) as f:
        header = f.readline().split()
        first = f.readline()
    assert header == ["40", str(Xtr.shape[1]), str(Ytr.shape[1])]
    labels, *feats = first.split(" ")
    assert [int(lab) for lab in labels.split(",")] == list(Ytr.indices[:Ytr.indptr[1]])
    assert [int(t.split(":")[0]) for t in feats] == list(Xtr.indices[:Xtr.indptr[1]])
    np.testing.assert_allclose([float(t.split(":")[1]) for t in feats],
                               Xtr.data[:Xtr.indptr[1]], rtol=1e-6)
    try:
        from slide.data import read_xc
    except ImportError:
        return
    X2, Y2 = read_xc(paths[1])
    assert X2.shape == Xte.shape and np.array_equal(Y2.indices, Yte.indices)
    np.testing.assert_allclose(X2.toarray(), Xte.toarray(), rtol=1e-6)
