"""The word neighbours (slide.rank.words): the index against a dense cosine computation, the
rows it leaves out, and what it keeps where the inputs are large."""
import numpy as np
import pytest
import scipy.sparse as sp

from slide.rank.words import WordIndex


def _dense_cosines(Q, X, power=1.0):
    """[n_queries, n_rows] cosines of the rows, their values v taken as sign(v) |v| ** power,
    0 for an all-zero row."""
    def unit(A):
        A = A.toarray().astype(np.float64)
        A = np.sign(A) * np.abs(A) ** power
        n = np.linalg.norm(A, axis=1, keepdims=True)
        return A / np.where(n == 0, 1.0, n)
    return unit(Q) @ unit(X).T


def _check_nearest(near, sims, S, k, allowed):
    """near/sims are each query's best k allowed rows of the ones sharing a word (S != 0 in
    pattern: ``shares``), best first; ties may come in any order."""
    for r in range(S.shape[0]):
        cand = np.flatnonzero(allowed[r])
        expect = np.sort(S[r, cand])[::-1][:k]
        got = near[r][near[r] >= 0]
        assert got.shape[0] == expect.shape[0]
        np.testing.assert_allclose(sims[r, :got.shape[0]], expect, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(S[r, got], expect, rtol=1e-5, atol=1e-6)
        assert len(set(got.tolist())) == got.shape[0]
        assert np.all(sims[r, got.shape[0]:] == -np.inf) and np.all(near[r, got.shape[0]:] == -1)


@pytest.mark.parametrize("negative,power", [(False, 1.0), (True, 1.0), (False, 0.5),
                                            (True, 0.5)])
def test_nearest_rows_are_the_best_cosines_of_the_rows_sharing_a_word(negative, power):
    rng = np.random.default_rng(0)
    X = sp.random(300, 80, density=0.05, random_state=1, format="csr", dtype=np.float32)
    Q = sp.random(40, 80, density=0.05, random_state=2, format="csr", dtype=np.float32)
    if negative:        # signed inputs: a sum that cancels to 0 is still a row met once
        X.data -= 0.5
        Q.data -= 0.5
    Q = sp.csr_matrix(Q.multiply(rng.random((40, 1)) * 5 + 0.1))      # not of unit norm
    S = _dense_cosines(Q, X, power)
    shares = (abs(Q).astype(bool).astype(np.int32) @ abs(X).astype(bool).T.astype(np.int32)
              ).toarray() > 0
    index = WordIndex.build(X, value_power=power)
    for k in (1, 7, 300):
        near, sims = index.nearest(Q, k)
        assert near.shape == (40, k) and near.dtype == np.int64 and sims.dtype == np.float32
        _check_nearest(near, sims, S, k, shares)
    exclude = rng.choice(300, 120, replace=False)
    near, sims = index.nearest(Q, 7, exclude=exclude)
    allowed = shares.copy()
    allowed[:, exclude] = False
    _check_nearest(near, sims, S, 7, allowed)
    assert not np.isin(near, exclude).any()


def test_empty_rows_and_unknown_words_find_nothing():
    X = sp.csr_matrix(np.array([[1, 0, 0, 0], [0, 2, 0, 0], [0, 0, 0, 0]], np.float32))
    Q = sp.csr_matrix(np.array([[0, 0, 0, 0], [0, 0, 3, 1], [0, 1, 1, 0]], np.float32))
    near, sims = WordIndex.build(X).nearest(Q, 2)
    assert np.all(near[:2] == -1) and np.all(sims[:2] == -np.inf)
    assert near[2].tolist() == [1, -1]
    np.testing.assert_allclose(sims[2, 0], 1 / np.sqrt(2), rtol=1e-6)


def test_a_large_input_is_indexed_by_a_seeded_subset_of_its_rows():
    X = sp.random(500, 60, density=0.1, random_state=3, format="csr", dtype=np.float32)
    whole = WordIndex.build(X)
    part = WordIndex.build(X, seed=4, max_entries=X.nnz // 3)
    again = WordIndex.build(X, seed=4, max_entries=X.nnz // 3)
    assert part.n_rows == whole.n_rows == 500
    assert 0 < part.rows.shape[0] <= X.nnz // 3
    np.testing.assert_array_equal(part.rows, again.rows)
    kept = np.unique(part.rows)
    assert 0 < kept.shape[0] < 500
    # every entry of a kept row is there: the subset's index is the index of the kept rows
    sub = sp.diags(np.isin(np.arange(500), kept).astype(np.float32)) @ X
    sub.eliminate_zeros()
    ref = WordIndex.build(sub)
    np.testing.assert_array_equal(part.ptr, ref.ptr)
    np.testing.assert_array_equal(part.rows, ref.rows)
    np.testing.assert_allclose(part.vals, ref.vals, rtol=1e-6)


def test_a_saved_index_loads_and_a_broken_one_is_refused():
    X = sp.random(50, 20, density=0.2, random_state=5, format="csr", dtype=np.float32)
    index = WordIndex.build(X)
    loaded = WordIndex.from_state(index.state(), 20)
    Q = X[:10]
    for a, b in zip(loaded.nearest(Q, 3), index.nearest(Q, 3)):
        np.testing.assert_array_equal(a, b)
    d = index.state()
    with pytest.raises(ValueError, match="feature count"):
        WordIndex.from_state(d, 21)
    with pytest.raises(ValueError, match="row ids outside"):
        WordIndex.from_state(dict(d, words_n_rows=3), 20)
    with pytest.raises(ValueError, match="format"):
        WordIndex.from_state(dict(d, words_format=9), 20)
    with pytest.raises(ValueError, match="value_power"):
        WordIndex.from_state(dict(d, words_value_power=-1.0), 20)
    assert WordIndex.from_state(d, 20).value_power == index.value_power == 0.5
    with pytest.raises(ValueError, match="k must be"):
        WordIndex.from_state(dict(d, words_k=0), 20)
    # a query gets the index's k as built, whatever the module's default is later
    three = WordIndex.from_state(WordIndex.build(X, k=3).state(), 20)
    assert three.k == 3 and three.nearest(Q)[0].shape == (10, 3)
