"""A stable sort written out for the kernels: Numba's ``np.argsort`` and ``np.sort`` compile
generic quick and merge sorts into every first fit (docs/design.md, "One compile a kernel"),
and the sorts the kernels need are short (a line's features, a label centroid's terms, a
row's neighbours' labels)."""
import numpy as np

from slide.kernels.jit import njit


@njit(cache=True, nogil=True)
def stable_order(keys, a, b):
    """The positions 0..b-a-1 of keys[a:b] in stable ascending order of their keys: a
    bottom-up merge sort (a line's sort in the XC parser was most of a cold first ``read_xc``
    by ``np.argsort``: 9.4 -> 5.4 s written out, ``bench/results/first_fit_debtags.md``)."""
    n = b - a
    order = np.empty(n, np.int64)
    spare = np.empty(n, np.int64)
    for k in range(n):
        order[k] = k
    width = 1
    while width < n:
        lo = 0
        while lo < n:
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i, j = lo, mid
            for o in range(lo, hi):
                # the left run's entry first on ties: stable
                if j >= hi or (i < mid and keys[a + order[i]] <= keys[a + order[j]]):
                    spare[o] = order[i]
                    i += 1
                else:
                    spare[o] = order[j]
                    j += 1
            lo = hi
        order, spare = spare, order
        width *= 2
    return order
