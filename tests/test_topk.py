"""The chunked exact top-k of a dense output layer (slide.kernels.topk): the products split
over threads by rows equal numpy's to float32 rounding (bit for bit where numpy and scipy
ship the same OpenBLAS build; scipy 1.17.1's 0.3.30 rounds some entries of a block by its
shape), and the vectorised log-sum-exp fold equals the scalar
one (the same top-k, the same log-sum-exp to float32 rounding of its terms)."""
import numba
import numpy as np
import pytest

from slide.kernels import topk


def _layer(n_rows, n_labels, seed=0):
    rng = np.random.default_rng(seed)
    H = rng.random((n_rows, 24), dtype=np.float32)
    W = (3 * rng.normal(size=(n_labels, 24))).astype(np.float32)
    return H, W, rng.normal(size=n_labels).astype(np.float32)


@pytest.mark.parametrize("n_rows", [7, 200])        # one product; a product per thread
def test_logit_chunks_equal_numpys_product(n_rows):
    H, W, b = _layer(n_rows, 1000)
    # two threads where the machine has them (an earlier test may have left one)
    before = numba.get_num_threads()
    threads = min(2, numba.config.NUMBA_NUM_THREADS)
    numba.set_num_threads(threads)
    try:
        n_parts, _ = topk.split_parts(H, W, b)
        got = np.concatenate([S for _, S in topk.logit_chunks(H, W, b, 300)], axis=1)
    finally:
        numba.set_num_threads(before)
    assert (n_parts > 1) == (threads > 1 and n_rows >= 2 * topk.MIN_PART_ROWS)
    ref = H @ W.T + b
    # a few ulps of the largest logit (|z| up to ~40): a wrong row, column or bias is far off
    assert np.abs(got - ref).max() <= 4 * np.spacing(np.abs(ref).max())
    # float64 inputs take numpy's product, exactly
    H64 = H.astype(np.float64)
    assert topk.split_parts(H64, W, b) == (1, 1)
    np.testing.assert_array_equal(topk.dense_logits(H64, W, b), H64 @ W.T + b)


def test_logits_into_cuts_columns_where_rows_are_too_few_for_the_threads(monkeypatch):
    """Parts of rows x columns (each column part a product of its own, copied in with the
    bias) give numpy's product to float32 rounding; on 16 threads a block of 128 rows is 4 row
    parts of 4 column parts each, 8 rows a thread's 32 stay numpy's one product, and rows
    enough for every thread are not cut in columns."""
    H, W, b = _layer(90, 1000)
    ref = H @ W.T + b
    for rows, cols in ((1, 3), (2, 3), (3, 7), (2, 1)):
        S = np.full((90, 1000), np.nan, np.float32)
        topk.logits_into(H, W, b, S, rows, cols)
        assert np.abs(S - ref).max() <= 4 * np.spacing(np.abs(ref).max()), (rows, cols)
    monkeypatch.setattr(topk.numba, "get_num_threads", lambda: 16)
    h = np.zeros((128, 8), np.float32)
    wide = np.zeros((32768, 8), np.float32)
    bias = np.zeros(32768, np.float32)
    assert topk.split_parts(h, wide, bias) == (4, 4)
    assert topk.split_parts(h[:40], wide, bias) == (1, 1)
    assert topk.split_parts(np.zeros((512, 8), np.float32), wide, bias) == (16, 1)
    assert topk.split_parts(h, wide[:4096], bias[:4096]) == (4, 2)


def _fold(fold, S, chunk, k=6):
    n = S.shape[0]
    ids, z = np.full((n, k), -1, np.int64), np.full((n, k), -np.inf)
    run_max, run_sum = np.full(n, -np.inf), np.zeros(n)
    for c0 in range(0, S.shape[1], chunk):
        fold(np.ascontiguousarray(S[:, c0:c0 + chunk]), c0, k, ids, z, run_max, run_sum)
    return ids, z, run_max + np.log(run_sum)


def test_the_vectorised_fold_matches_the_scalar_fold_also_on_rows_with_inf_or_nan():
    rng = np.random.default_rng(1)
    S = (8 * rng.normal(size=(40, 3000))).astype(np.float32)
    S[5, 17] = np.inf
    S[9, 2500] = np.nan
    S[11, :] = -40.0                                    # a row of ties: the lower ids first
    ids0, z0, lse0 = _fold(topk.fold_logits, S.astype(np.float64), 700)
    ids1, z1, lse1 = _fold(topk.fold_logits_f32, S, 700)
    np.testing.assert_array_equal(ids1, ids0)
    np.testing.assert_array_equal(z1, z0)
    assert list(ids1[11]) == list(range(6))
    finite = np.isfinite(lse0)
    # the rows with an inf or NaN took the scalar loop: the same result (not finite) both ways
    assert finite.sum() == 38 and not finite[5] and not finite[9]
    np.testing.assert_array_equal(lse1[~finite], lse0[~finite])
    np.testing.assert_allclose(lse1[finite], lse0[finite], rtol=1e-8)
    ref = np.log(np.exp(S[0].astype(np.float64) - S[0].max()).sum()) + S[0].max()
    assert abs(lse1[0] - ref) < 1e-6


def test_the_parallel_softmax_matches_numpys_and_leaves_bad_rows_to_it():
    rng = np.random.default_rng(2)
    z = (6 * rng.normal(size=(50, 777))).astype(np.float32)
    z[4, 3] = np.inf
    z[7, 9] = np.nan
    z[8, :] = -200.0                                    # far below exp's floor: uniform
    with np.errstate(invalid="ignore"):
        ref = topk._numpy_softmax(z.astype(np.float64))
        got = topk.probabilities(z.copy(), False)
        bad = topk._numpy_softmax(z[[4, 7]].copy())
    assert got.dtype == np.float32
    ok = np.ones(50, bool)
    ok[[4, 7]] = False
    np.testing.assert_allclose(got[ok], ref[ok], rtol=2e-6, atol=1e-12)
    np.testing.assert_allclose(got[ok].sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(got[[4, 7]], bad)     # numpy's own result, NaN included


def test_the_output_layers_dense_logits_equal_numpys_product():
    from slide.kernels.output import OutputLayer
    H, W, b = _layer(300, 2000, seed=3)
    before = numba.get_num_threads()
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    try:
        got = OutputLayer(W, b, False).logits(H)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_allclose(got, H @ W.T + b, rtol=2e-6, atol=2e-5)


def test_strongest_entries_keep_what_a_stable_sort_by_magnitude_keeps():
    """Each row's m largest magnitudes, ties to the earlier entries, as the first m of a
    stable argsort of -|x| (rows with many ties: values drawn from a few levels and signs)."""
    from slide.kernels.topk import strongest_entries
    rng = np.random.default_rng(5)
    lens = rng.integers(0, 40, size=300)
    x_ptr = np.zeros(lens.shape[0] + 1, np.int64)
    np.cumsum(lens, out=x_ptr[1:])
    x_dat = (rng.integers(1, 6, size=x_ptr[-1]) * rng.choice([-1, 1], size=x_ptr[-1]))
    x_dat = (x_dat * 0.25).astype(np.float32)
    for m in (1, 3, 10):
        keep = np.zeros(x_ptr[-1], np.bool_)
        strongest_entries(x_ptr, x_dat, m, keep)
        expect = np.zeros_like(keep)
        for r in range(lens.shape[0]):
            p0 = x_ptr[r]
            order = np.argsort(-np.abs(x_dat[p0:x_ptr[r + 1]]), kind="stable")[:m]
            expect[p0 + order] = True
        np.testing.assert_array_equal(keep, expect)
        assert keep.sum() == np.minimum(lens, m).sum()
