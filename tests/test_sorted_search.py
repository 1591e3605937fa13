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


def _reference_layout(C, S, cap):
    """[C | S minus C (in S's order, up to cap)], C's positions in S, each id's column in S."""
    rest = [v for v in S if v not in set(C)]
    out = list(C) + rest[:max(0, cap - len(C))]
    where = {v: i for i, v in enumerate(S)}
    return out, sorted(where[v] for v in C if v in where), [where.get(v, -1) for v in out]


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("ascending", [True, False])
def test_shared_block_layout_and_columns_match_a_plain_reference(ascending, lazy):
    """``sample._append_shared`` (one merge when C ascends, a search per id otherwise) and
    ``block._active_columns`` (C's positions taken from what the former left, each checked)
    give the layout and columns of a plain set computation, whatever stale positions the
    scratch held before. ``lazy`` (the batched softmax's): the same size, C's entries, C's
    columns and the extras, and S minus C left unwritten (its stale values kept) exactly
    where the set holds all of S; where the capacity cuts S, everything is written."""
    from slide.kernels.sample import _append_shared
    from slide.network.block import _active_columns

    @njit(cache=True)
    def layout(out, n_c, S, col, extra, pos, lazy):
        n = _append_shared(out, n_c, S, pos, not lazy)
        n_x = _active_columns(out[:n], n_c, n, S, col, extra, pos, lazy)
        return n, n_x

    rng = np.random.default_rng(5)
    for _ in range(300):
        S = np.sort(rng.choice(400, rng.integers(1, 60), replace=False)).astype(np.int64)
        C = rng.choice(400, rng.integers(0, 30), replace=False).astype(np.int64)
        if ascending:
            C = np.sort(C)
        cap = int(len(C) + rng.integers(0, len(S) + 1))
        out = np.full(cap + 1, -7, np.int64)                  # stale: never an id
        out[:len(C)] = C
        col = np.full(cap + 1, -7, np.int32)
        extra = np.zeros(cap + 1, np.int32)
        pos = rng.integers(-5, 500, 64).astype(np.int32)      # stale scratch
        n, n_x = layout(out[:cap], len(C), S, col, extra, pos, lazy)
        want_out, want_pos, want_col = _reference_layout(C.tolist(), S.tolist(), cap)
        assert n == len(want_out)
        assert extra[:n_x].tolist() == [v for v, c in zip(want_out, want_col) if c < 0]
        assert sorted(pos[:len(want_pos)].tolist()) == want_pos
        n_c = len(C)
        assert out[:n_c].tolist() == want_out[:n_c]
        assert col[:n_c].tolist() == want_col[:n_c]
        holds_all_of_s = n - n_x == len(S)
        if lazy and holds_all_of_s:
            # what block_loss's row pass reads is right; the rest was not touched
            assert set(out[n_c:n].tolist()) <= {-7}
            assert set(col[n_c:n].tolist()) <= {-7}
        else:
            assert out[:n].tolist() == want_out
            assert col[:n].tolist() == want_col
