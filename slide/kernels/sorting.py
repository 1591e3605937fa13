"""``stable_order``: a stable sort's order of a run of keys, written out.

Numba's ``np.argsort`` and ``np.sort`` compile its generic quicksort and mergesort for every
key type they meet, and a kernel that sorts short runs (a text line's indices, a row's
neighbour labels or terms) pays for that at its first compile. This plain merge sort
compiles in a fraction of that and gives the same order as ``np.argsort(kind="stable")``
(a cold first ``read_xc``: 9.4 -> 5.4 s, ``bench/results/first_fit_debtags.md``).
"""
import numpy as np

from slide.kernels.jit import njit


@njit(cache=True, nogil=True)
def stable_order(keys, a, b):
    """The positions 0..b-a-1 of keys[a:b] in stable ascending order of their keys (ties:
    the earlier position first): a bottom-up merge sort."""
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
