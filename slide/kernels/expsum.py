"""A vectorisable exp for the softmax over a row of logits.

``math.exp`` in a Numba loop is a call into libm per element: LLVM cannot vectorise it (this
build has no SVML), and the batched engine's corrected softmax, one exp per active column of
every sample, spent most of its time there. Here exp is
plain arithmetic that LLVM turns into SIMD code: e^x = (e^(x/128))^128, e^(x/128) from its
Taylor series to degree 11 and seven squarings (relative error ~3e-9 in float64; a table of
2^k after an integer range reduction is an indexed load, which kept the loop scalar). Inputs
are shifted logits (x <= 0); below -87 (where float32 stops being normal) the result is that
of -87, ~1.6e-38: no softmax term there matters.
"""
import math

import numpy as np

from slide.kernels.jit import njit
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
def max_and_finite(z):
    """(largest entry of the float32 row z, whether every entry is finite): the shift of a
    softmax over a row of S's logits and its divergence check (an inf or NaN there is an
    overflow: S's offsets are finite). Eight independent maxima, which the compiler packs
    into one vector max (a single running max stays scalar without "nnan"), and a sum of
    z * 0 (0 unless some entry is inf or NaN). The maximum is the same whatever the order.
    -inf for an empty row."""
    n = z.shape[0]
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = np.float32(-np.inf)
    n8 = n - n % 8
    for c in range(0, n8, 8):
        a0, a1, a2, a3 = z[c], z[c + 1], z[c + 2], z[c + 3]
        a4, a5, a6, a7 = z[c + 4], z[c + 5], z[c + 6], z[c + 7]
        m0 = a0 if a0 > m0 else m0
        m1 = a1 if a1 > m1 else m1
        m2 = a2 if a2 > m2 else m2
        m3 = a3 if a3 > m3 else m3
        m4 = a4 if a4 > m4 else m4
        m5 = a5 if a5 > m5 else m5
        m6 = a6 if a6 > m6 else m6
        m7 = a7 if a7 > m7 else m7
    for c in range(n8, n):
        a0 = z[c]
        m0 = a0 if a0 > m0 else m0
    chk = np.float32(0.0)
    for c in range(n):
        chk += z[c] * np.float32(0.0)
    m = max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))
    return np.float64(m), chk == 0.0


# the sum's flags: no "reassoc", so its order is the code's own (a vectorised reduction with
# reassoc gave sums that differed in the last bit between a freshly compiled and a cached
# kernel, and a run resumed from a checkpoint must repeat the uninterrupted one bit for bit)
ORDERED = FASTMATH - {"reassoc"}


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def exp_shifted_inplace(z, shift):
    """z[c] = e^(z[c] - shift) for the float32 row z (shift >= every entry, no NaN in z);
    returns the sum of the new entries (float64, ``ordered_sum``)."""
    for c in range(z.shape[0]):
        z[c] = exp_nonpositive(np.float64(z[c]) - shift)
    return ordered_sum(z)


@njit(cache=True, nogil=True, fastmath=ORDERED)
def ordered_sum(z):
    """The sum of the float32 row z in float64, in a fixed order: eight interleaved partial
    sums (independent lanes, which the compiler may still pack into one vector add), then
    the tail, then the eight in order."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
    n8 = z.shape[0] - z.shape[0] % 8
    for c in range(0, n8, 8):
        s0 += z[c]
        s1 += z[c + 1]
        s2 += z[c + 2]
        s3 += z[c + 3]
        s4 += z[c + 4]
        s5 += z[c + 5]
        s6 += z[c + 6]
        s7 += z[c + 7]
    for c in range(n8, z.shape[0]):
        s0 += z[c]
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
