"""The sampled baselines' shared negatives (bench/baselines/torch_sampled.py): drawn as TF's
unique fixed-unigram sampler draws them, with its expected counts (no PyTorch needed)."""
import numpy as np
import pytest

from bench.baselines.torch_sampled import UnigramCandidates


def test_draws_are_distinct_and_include_the_head():
    counts = np.array([50, 0, 3, 9, 0, 120, 7, 1, 0, 2, 30, 4])
    c = UnigramCandidates(counts, num_sampled=6, n_head=2)
    rng = np.random.default_rng(0)
    for _ in range(50):
        labels, log_exp = c.draw(rng)
        assert labels.shape == (6,) and np.unique(labels).shape == (6,)
        assert labels[:2].tolist() == [0, 5]             # the two most frequent, sorted
        assert np.all(log_exp[:2] == 0.0)             # the head: expected count 1
        np.testing.assert_array_equal(log_exp, c.log_expected(labels))
        assert c.tries >= 4
    assert np.all(c.log_expected(np.array([0, 5])) == 0.0)


def test_expected_counts_match_how_often_a_label_is_drawn():
    rng = np.random.default_rng(1)
    counts = rng.zipf(1.6, size=40) % 200
    c = UnigramCandidates(counts, num_sampled=8)
    n = 4000
    seen = np.zeros(40)
    predicted = np.zeros(40)
    for _ in range(n):
        labels, log_exp = c.draw(rng)
        seen[labels] += 1
        # the expected count of every label under this draw's number of tries
        predicted += np.exp(c.log_expected(np.arange(40)))
    # TF's estimate treats the number of tries as fixed, though it depends on which labels
    # came up: close for the rare labels, a little high for the most frequent ones
    rare = predicted / n < 0.2
    np.testing.assert_allclose((seen / n)[rare], (predicted / n)[rare], atol=0.015)
    np.testing.assert_allclose(seen / n, predicted / n, atol=0.1)
    assert abs((seen / n).sum() - 8) < 1e-9


def test_too_many_negatives_is_a_clear_error():
    with pytest.raises(ValueError, match="num_sampled"):
        UnigramCandidates(np.ones(5), num_sampled=7)
