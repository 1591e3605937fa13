"""A vectorisable exp for the softmax over a row of logits.

``math.exp`` in a Numba loop is a call into libm per element: LLVM cannot vectorise it (this
build has no SVML), and the batched engine's corrected softmax spent most of its time there
(2.2 of 7.9 ms a batch at 200k labels, ``bench/results/block_phases_*.log``). Here exp is
plain arithmetic that LLVM turns into SIMD code: e^x = (e^(x/128))^128, e^(x/128) from its
Taylor series to degree 11 and seven squarings (relative error ~3e-9 in float64; a table of
2^k after an integer range reduction is an indexed load, which kept the loop scalar). Inputs are shifted logits (x <= 0); below -87 (where float32 stops
being normal) the result is that of -87, ~1.6e-38: no softmax term there matters.
"""
import math

import numpy as np
from numba import njit

from slide.kernels.layers import FASTMATH

EXP_FLOOR = -87.0
# 1 / n! for the Taylor series of e^y, |y| <= -EXP_FLOOR / 128 = 0.68
C3, C4, C5, C6, C7, C8, C9, C10, C11 = (1.0 / math.factorial(n) for n in range(3, 12))


@njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def exp_nonpositive(x):
    """e^x for x <= 0 (float64; x below EXP_FLOOR counts as EXP_FLOOR; NaN is not allowed:
    the callers check their logits first)."""
    y = max(x, EXP_FLOOR) * (1.0 / 128.0)
    p = 1.0 + y * (1.0 + y * (0.5 + y * (C3 + y * (C4 + y * (C5 + y * (C6 + y * (C7 + y * (
        C8 + y * (C9 + y * (C10 + y * C11))))))))))
    for _ in range(7):
        p *= p
    return p


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def max_or_nan(z):
    """(largest entry of the float32 row z, whether z holds a NaN): the shift of a softmax and
    its divergence check in one vectorised pass (-inf for an empty row)."""
    m = -np.inf
    bad = False
    for c in range(z.shape[0]):
        v = np.float64(z[c])
        bad |= v != v
        m = max(m, v)
    return m, bad


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def exp_shifted_inplace(z, shift):
    """z[c] = e^(z[c] - shift) for the float32 row z (shift >= every entry, no NaN in z);
    returns the sum of the new entries (float64)."""
    total = 0.0
    for c in range(z.shape[0]):
        e = exp_nonpositive(np.float64(z[c]) - shift)
        z[c] = e
        total += e
    return total
