"""The exact head of the shared negatives (slide.kernels.negatives.SharedNegatives, n_head > 0):
the most frequent labels are in every draw with weight 1, the rest are drawn from the other
labels with the inclusion probabilities the correction uses, and the normaliser's estimate
stays unbiased."""
import numpy as np
import pytest

import slide
from slide.kernels.negatives import SharedNegatives, head_size

N_OUT, N_SHARED, N_HEAD = 60, 12, 4


def _negatives(n_head=N_HEAD, seed=0):
    neg = SharedNegatives(N_SHARED, 1.0, N_OUT, n_head)
    counts = np.random.default_rng(seed).zipf(1.6, N_OUT).clip(max=400)
    neg.set_label_counts(counts)
    return neg, counts


def test_head_is_the_most_frequent_labels_and_always_drawn_with_weight_one():
    neg, counts = _negatives()
    top = np.argsort(-counts, kind="stable")[:N_HEAD]
    np.testing.assert_array_equal(neg.head, np.sort(top))
    for serial in range(50):
        ids = neg.draw(7, serial)
        assert np.isin(neg.head, ids).all()
        assert np.all(np.diff(ids) > 0) and ids.shape[0] <= N_SHARED
        np.testing.assert_array_equal(neg.corr[neg.head], 0.0)
        np.testing.assert_array_equal(neg.corr_mix[neg.head], 0.0)
    # the tail's draws never land on the head: the draw has n_shared - n_head tail draws
    assert neg.tail_q[neg.head].sum() == 0.0
    assert neg.tail_q.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("n_head", [0, N_HEAD])
def test_offsets_are_made_with_the_distribution_for_every_label(n_head):
    """corr / corr_mix hold every tail label's offsets once the distribution is set (the
    draws no longer write them): the per-label formula with the draw's number of draws, 0 on
    the head, and no draw changes them."""
    neg, _ = _negatives(n_head)
    n_draws = N_SHARED - neg.head.shape[0]
    p = np.maximum(-np.expm1(n_draws * np.log1p(-np.minimum(neg.tail_q, 1.0 - 1e-12))), 1e-300)
    tail = np.setdiff1d(np.arange(N_OUT), neg.head)
    np.testing.assert_allclose(neg.corr[tail], -np.log(p[tail]), rtol=1e-6)
    np.testing.assert_allclose(neg.corr_mix[tail], np.log(0.5 + 0.5 / p[tail]), rtol=1e-6)
    assert not neg.corr[neg.head].any() and not neg.corr_mix[neg.head].any()
    before = (neg.corr.copy(), neg.corr_mix.copy())
    for serial in range(20):
        neg.draw(5, serial)
    neg.draw_ahead(5, 100, 3)
    np.testing.assert_array_equal(neg.corr, before[0])
    np.testing.assert_array_equal(neg.corr_mix, before[1])


def test_tail_inclusion_probabilities_match_the_draws():
    """exp(-corr[j]) -- the probability the correction divides by -- against the frequency
    with which j is drawn, over 6,000 batches (binomial tolerance, 5 sigma)."""
    neg, _ = _negatives()
    n = 6000
    seen = np.zeros(N_OUT)
    for serial in range(n):
        seen[neg.draw(3, serial)] += 1
    # every id drawn at least once has its weight recorded
    p = np.exp(-neg.corr.astype(np.float64))
    drawn = seen > 0
    freq = seen / n
    sigma = np.sqrt(p * (1 - p) / n) + 1e-9
    assert np.all(np.abs(freq[drawn] - p[drawn]) < 5 * sigma[drawn] + 2e-3)
    np.testing.assert_array_equal(freq[neg.head], 1.0)


def test_normaliser_estimate_is_unbiased_with_a_head():
    """E over the draw of sum_{j in S} exp(z_j) / P(j in S) = sum_j exp(z_j) (head: P = 1)."""
    neg, _ = _negatives()
    z = np.random.default_rng(5).normal(0, 1.5, N_OUT)
    full = np.exp(z).sum()
    est = []
    for serial in range(4000):
        ids = neg.draw(11, serial)
        est.append((np.exp(z[ids] + neg.corr[ids].astype(np.float64))).sum())
    est = np.array(est)
    assert abs(est.mean() - full) < 5 * est.std() / np.sqrt(est.size)


def test_head_lowers_the_normaliser_variance():
    """Why the head exists: at equal block size, the estimate's spread shrinks when the
    head's mass is exact (logits that follow frequency, as a log-prior start makes them)."""
    spread = {}
    for n_head in (0, N_HEAD):
        neg, counts = _negatives(n_head)
        z = np.log(counts + 1.0)
        est = [np.exp(z[ids] + neg.corr[ids].astype(np.float64)).sum()
               for ids in (neg.draw(2, s) for s in range(2000))]
        spread[n_head] = np.std(est)
    assert spread[N_HEAD] < 0.8 * spread[0]


def test_head_size_and_estimator_parameter():
    assert head_size(2048, 0.125) == 256 and head_size(24, 0.0) == 0 and head_size(7, 0.5) == 3
    with pytest.raises(ValueError, match="exact_head"):
        slide.SlideClassifier(exact_head=1.0).fit(np.eye(4, dtype=np.float32),
                                                  [[0], [1], [2], [3]])


def test_uniform_draws_have_no_head():
    neg = SharedNegatives(N_SHARED, 0.0, N_OUT, N_HEAD)
    assert neg.n_head == 0 and neg.head.shape[0] == 0


@pytest.mark.parametrize("n_out", [1, 7, 3000, 200_003])
def test_bucketed_draw_search_gives_numpys_ids(n_out):
    """``distinct_draws`` (a binary search inside the draw's bucket of the cdf) returns exactly
    the distinct ids of numpy's ``searchsorted(cdf, u, "right")``: skewed and uniform q, zero
    q (a head), draws on bucket edges, below the first and at the last cdf entry."""
    from slide.kernels.negatives import CDF_BUCKETS, cdf_buckets, distinct_draws
    rng = np.random.default_rng(n_out)
    for q in (rng.zipf(1.2, n_out).astype(np.float64) % 10_000 + 1.0, np.ones(n_out)):
        q[rng.random(n_out) < 0.2] = 0.0            # labels that cannot be drawn
        if q.sum() == 0:
            q[0] = 1.0
        cdf = np.cumsum(q / q.sum())
        cdf[-1] = 1.0
        lo = cdf_buckets(cdf)
        edges = np.arange(0, CDF_BUCKETS, 997) / CDF_BUCKETS
        u = np.sort(np.concatenate([rng.random(5000), edges, cdf[:50], [0.0, 1.0 - 1e-17]]))
        u = u[u < 1.0]
        expect = np.unique(np.minimum(np.searchsorted(cdf, u, side="right"), n_out - 1))
        out = np.empty(u.shape[0], np.int32)
        got = out[:distinct_draws(cdf, lo, u, n_out - 1, out)]
        np.testing.assert_array_equal(got, expect)


@pytest.mark.parametrize("n_head", [0, N_HEAD])
def test_draws_made_ahead_are_the_batches_own_draws(n_head):
    """``draw_ahead`` (several batches' draws at once, one a thread) gives each batch exactly
    ``draw``'s ids and inclusion weights, asked in any order and at any look-ahead; a new
    label distribution drops the draws made from the old one."""
    neg, counts = _negatives(n_head)
    ref, _ = _negatives(n_head)
    for serial, n_ahead in [(1, 4), (2, 4), (4, 4), (3, 1), (9, 3), (5, 2), (10, 3), (11, 3)]:
        ids = neg.draw_ahead(7, serial, n_ahead)
        want = ref.draw(7, serial)
        np.testing.assert_array_equal(ids, want)
        np.testing.assert_array_equal(neg.corr[want], ref.corr[want])
        np.testing.assert_array_equal(neg.corr_mix[want], ref.corr_mix[want])
    assert not np.array_equal(neg.draw_ahead(8, 10, 3), neg.draw_ahead(7, 10, 3))
    neg.draw_ahead(7, 20, 5)
    neg.set_label_counts(counts[::-1])
    ref.set_label_counts(counts[::-1])
    for serial in (21, 20):
        np.testing.assert_array_equal(neg.draw_ahead(7, serial, 5), ref.draw(7, serial))
