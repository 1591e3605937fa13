"""The shared block's row steps start where the batch's serial says: batches in flight apart."""
import numpy as np
import pytest

from slide.network.row_steps import _block_row, block_start


@pytest.mark.parametrize("n", [1024, 256, 96])
def test_batches_in_flight_start_apart(n):
    # any W consecutive serials (the batches in flight at once) start at least 0.45 n / W
    # rows apart, around the block
    for w in range(2, 17):
        worst = n
        for first in range(1, 3000):
            starts = sorted(block_start(s, n) for s in range(first, first + w))
            gaps = np.diff(starts + [starts[0] + n])
            worst = min(worst, gaps.min())
        assert worst >= int(0.45 * n / w), (n, w, worst)


def test_a_walk_visits_every_row_once_and_names_the_next():
    for n, start in [(5, 0), (5, 3), (5, 4), (1, 0)]:
        walk = [_block_row(q, n, start) for q in range(n)]
        rows = [r for r, _ in walk]
        assert sorted(rows) == list(range(n)) and rows[0] == start
        assert [f for _, f in walk] == rows[1:] + [-1]
    assert block_start(12345, 0) == 0
    assert all(0 <= block_start(s, 3) < 3 for s in range(1, 200))
