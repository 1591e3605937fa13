"""The searches of sorted id lists that the batched engine's per-sample bookkeeping runs:
``seek_sorted`` (a galloping cursor over ids visited mostly in ascending order) must give
exactly ``find_sorted``'s positions whatever the order of the ids it is asked for."""
import numpy as np
import pytest
from numba import njit

from slide.kernels.negatives import find_sorted, seek_sorted


@njit(cache=True)
def _both(a, queries):
    full = np.empty(queries.shape[0], np.int64)
    seek = np.empty(queries.shape[0], np.int64)
    cursor = 0
    for i in range(queries.shape[0]):
        full[i] = find_sorted(a, queries[i])
        seek[i], cursor = seek_sorted(a, queries[i], cursor)
    return full, seek


@pytest.mark.parametrize("order", ["ascending", "random", "ascending_then_random"])
def test_seek_sorted_finds_what_find_sorted_finds(order):
    rng = np.random.default_rng(3)
    for _ in range(400):
        a = np.sort(rng.choice(300, rng.integers(0, 80), replace=False)).astype(np.int64)
        q = rng.integers(-3, 305, rng.integers(0, 120)).astype(np.int64)
        if order == "ascending":
            q = np.sort(q)
        elif order == "ascending_then_random":
            q = np.concatenate([np.sort(q), rng.integers(-3, 305, 7)])
        full, seek = _both(a, q)
        np.testing.assert_array_equal(seek, full)


def test_seek_sorted_hits_both_ends_and_repeats():
    a = np.array([2, 5, 9, 40, 41, 42, 1000], np.int64)
    q = np.array([2, 2, 1000, 1000, 0, 41, 42, 43, 1001, 5], np.int64)
    full, seek = _both(a, q)
    np.testing.assert_array_equal(seek, full)
    assert seek.tolist() == [0, 0, 6, 6, -1, 4, 5, -1, -1, 1]
