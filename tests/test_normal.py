"""Gaussian draws of the weight init (slide.kernels.normal): the vectorisable log and sin/cos
against numpy's (libm), and the pairs against Box-Muller computed with them."""
import math

import numpy as np
from numba import njit

from slide.kernels.layers import _init_normal
from slide.kernels.normal import cos_sin_turn, log_of_uniform, normal_pair
from slide.kernels.rng import splitmix64, stream_seed


@njit(cache=True)
def _logs(m, out):
    for i in range(m.shape[0]):
        out[i] = log_of_uniform(m[i])


@njit(cache=True)
def _turns(b, c, s):
    for i in range(b.shape[0]):
        c[i], s[i] = cos_sin_turn(b[i])


@njit(cache=True)
def _uniform_words(seed, stream, n, a, b):
    """The two uint64 words of pairs 0, 2, 4, ... as normal_pair draws them."""
    for p in range(n):
        s = stream_seed(seed, stream, 2 * p)
        s, a[p] = splitmix64(s)
        s, b[p] = splitmix64(s)


def test_log_of_uniform_matches_libm_to_a_few_ulp():
    rng = np.random.default_rng(0)
    m = np.concatenate([rng.integers(1, 2 ** 53, 100_000, dtype=np.int64),
                        [1, 2, 3, 2 ** 52, 2 ** 52 + 1, 2 ** 53, 6369051672525772,
                         6369051672525773]]).astype(np.uint64)
    got = np.empty(m.shape[0])
    _logs(m, got)
    want = np.log(m.astype(np.float64) * 2.0 ** -53)
    assert got[-3] == 0.0                                  # u = 1
    ok = want != 0
    assert np.max(np.abs(got[ok] - want[ok]) / np.abs(want[ok])) < 1e-15


def test_cos_sin_of_a_turn_match_libm():
    rng = np.random.default_rng(1)
    b = rng.integers(0, 2 ** 63, 100_000, dtype=np.int64).astype(np.uint64) * np.uint64(2)
    b = np.concatenate([b, np.array([0, 1 << 62, 2 << 62, 3 << 62, 2 ** 64 - 1], np.uint64)])
    c, s = np.empty(b.shape[0]), np.empty(b.shape[0])
    _turns(b, c, s)
    u = (b >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    assert np.abs(c - np.cos(2 * np.pi * u)).max() < 2e-15
    assert np.abs(s - np.sin(2 * np.pi * u)).max() < 2e-15
    assert abs(c[-5] - 1.0) < 1e-15 and abs(s[-5]) < 1e-15        # u = 0


def test_pairs_are_box_muller_of_the_counter_words():
    """normal_pair = Box-Muller over the same uniform words with libm's log/cos/sin, to float32
    rounding (a handful of draws in 10^7 may differ by one float32 ulp)."""
    n, std = 200_000, 0.05
    seed, stream = np.uint64(7), np.uint64(1000)
    a, b = np.empty(n, np.uint64), np.empty(n, np.uint64)
    _uniform_words(seed, stream, n, a, b)
    u1 = ((a >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0 ** -53
    u2 = (b >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    r = np.sqrt(-2.0 * np.log(u1)) * std
    want = np.empty(2 * n, np.float32)
    want[0::2] = (r * np.cos(2 * np.pi * u2)).astype(np.float32)
    want[1::2] = (r * np.sin(2 * np.pi * u2)).astype(np.float32)
    got = np.empty(2 * n, np.float32)
    _init_normal(got, 0, 2 * n, std, seed, stream)
    diff = got != want
    assert diff.sum() <= 2
    np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-12)
    assert abs(got.std() / std - 1) < 0.01 and abs(got.mean()) < 0.01 * std
    # a single pair, as slide.distributed draws rows, is the init's pair
    assert normal_pair(seed, stream, 10, std) == (got[10], got[11])


def test_init_any_range_and_odd_length():
    """Chunks and an odd tail give the draws of the positions, wherever the range starts."""
    W = np.empty(20_001, np.float32)
    _init_normal(W, 0, 20_001, 0.1, np.uint64(3), np.uint64(1001))
    V = np.empty(20_001, np.float32)
    _init_normal(V, 6, 9_999, 0.1, np.uint64(3), np.uint64(1001))
    np.testing.assert_array_equal(V[6:9_999], W[6:9_999])
    assert math.isfinite(float(W.sum()))
