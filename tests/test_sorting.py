import numpy as np
import pytest

from slide.kernels.sorting import stable_order


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32])
def test_stable_order_is_numpys_stable_argsort_of_the_run(dtype):
    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 3, 7, 64, 257):
        keys = rng.integers(-5, 6, n + 6).astype(dtype)    # many ties
        a, b = 3, 3 + n
        want = np.argsort(keys[a:b], kind="stable")
        np.testing.assert_array_equal(stable_order(keys, a, b), want)
    keys = -np.abs(rng.standard_normal(100).astype(np.float32))
    np.testing.assert_array_equal(stable_order(keys, 0, 100), np.argsort(keys, kind="stable"))
