"""Gaussian draws from the counter RNG (``slide.kernels.rng``): Box-Muller with its own log and
sin/cos, plain float64 arithmetic that LLVM turns into SIMD code.

Box-Muller needs log(u1), cos(2 pi u2) and sin(2 pi u2) per pair of normals. ``math.log`` /
``math.cos`` in a Numba loop are calls into libm, one element at a time: the weights' init
was a third of the time before the first batch at the Amazon-670K shape (103M weights).
Written out as polynomials after an exact range reduction they vectorise, several times faster
than libm's calls:

* log(u1), u1 = m 2^-53 with the integer m in [1, 2^53]: m = 2^e f with f in [sqrt(1/2),
  sqrt(2)) (e from the float's exponent bits), log f = 2 atanh(s), s = (f - 1) / (f + 1),
  |s| <= 0.172, by its odd series to s^23; relative error ~3e-16.
* cos / sin (2 pi u2): the top two bits of u2 pick the quarter turn, the other 51 give
  x in [-pi/4, pi/4) (exact), Taylor series of sin x and cos x to degree 17 / 18, rotated by
  pi/4 and the quarter turn; absolute error ~8e-16.

Both are a few ulp of float64 from libm's, so the float32 weights equal the libm-based ones
except in ~1 of 10^7 draws (1 ulp of float32 there). No fastmath and no libm: the same bits
on any machine with IEEE float64. ``error_model="numpy"``: a float division under Numba's
default model checks its divisor for zero, a branch that keeps the loop scalar.
"""
import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from slide.kernels.jit import njit
from slide.kernels.rng import splitmix64, stream_seed


@intrinsic
def _f64_bits(typingctx, x):
    """The IEEE bits of the float64 x as a uint64 (a register move: vectorises)."""
    sig = types.uint64(types.float64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))
    return sig, codegen


@intrinsic
def _bits_f64(typingctx, b):
    """The float64 whose IEEE bits are the uint64 b."""
    sig = types.float64(types.uint64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return sig, codegen


LN2 = math.log(2.0)
INV_SQRT2 = 1.0 / math.sqrt(2.0)
TWO_PI = 2.0 * math.pi
QUARTER_PI = math.pi / 4.0
# 1 / (2k + 1), k = 1..11: log f = 2 (s + s^3/3 + s^5/5 + ...)
A3, A5, A7, A9, A11, A13, A15, A17, A19, A21, A23 = (1.0 / (2 * k + 1) for k in range(1, 12))
# (-1)^k / (2k + 1)!, k = 1..8 and (-1)^k / (2k)!, k = 1..9
S3, S5, S7, S9, S11, S13, S15, S17 = ((-1) ** k / math.factorial(2 * k + 1) for k in range(1, 9))
C2, C4, C6, C8, C10, C12, C14, C16, C18 = ((-1) ** k / math.factorial(2 * k) for k in range(1, 10))
MANTISSA = np.uint64(0x000FFFFFFFFFFFFF)
LOW51 = np.uint64((1 << 51) - 1)
TWO_M53 = 1.0 / 9007199254740992.0


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def log_of_uniform(m):
    """log(m * 2^-53) for the integer m in [1, 2^53] (uint64); float64."""
    x = np.float64(np.int64(m))                       # exact: m <= 2^53
    # e = the exponent of x / sqrt(2), rounded up: x = 2^e f with f in [sqrt(1/2), sqrt(2))
    e = np.int64(_f64_bits(x * INV_SQRT2) >> np.uint64(52)) - 1022
    f = x * _bits_f64(np.uint64(1023 - e) << np.uint64(52))  # x * 2^-e, exact
    s = (f - 1.0) / (f + 1.0)
    z = s * s
    p = A21 + z * A23
    p = A19 + z * p
    p = A17 + z * p
    p = A15 + z * p
    p = A13 + z * p
    p = A11 + z * p
    p = A9 + z * p
    p = A7 + z * p
    p = A5 + z * p
    p = A3 + z * p
    return np.float64(e - 53) * LN2 + (2.0 * s + 2.0 * s * z * p)


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def cos_sin_turn(b):
    """(cos, sin) of 2 pi u for u = (b >> 11) 2^-53 in [0, 1), from the uint64 b."""
    k = np.int64(b >> np.uint64(62))                  # the quarter turn: u's top two bits
    r = np.float64(np.int64((b >> np.uint64(11)) & LOW51)) * TWO_M53   # in [0, 1/4)
    x = r * TWO_PI - QUARTER_PI
    z = x * x
    sp = S15 + z * S17
    sp = S13 + z * sp
    sp = S11 + z * sp
    sp = S9 + z * sp
    sp = S7 + z * sp
    sp = S5 + z * sp
    sp = S3 + z * sp
    sx = x + x * z * sp
    cp = C16 + z * C18
    cp = C14 + z * cp
    cp = C12 + z * cp
    cp = C10 + z * cp
    cp = C8 + z * cp
    cp = C6 + z * cp
    cp = C4 + z * cp
    cp = C2 + z * cp
    cx = 1.0 + z * cp
    # (cos, sin) of x + pi/4, then turned by k quarter turns
    c0 = (cx - sx) * INV_SQRT2
    s0 = (sx + cx) * INV_SQRT2
    odd = (k & 1) == 1
    c1 = s0 if odd else c0
    s1 = c0 if odd else s0
    c = -c1 if (k == 1) | (k == 2) else c1
    s = -s1 if k >= 2 else s1
    return c, s


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def normal_pair(seed, stream, i, std):
    """The Box-Muller pair (float32, scaled by ``std``) of flat positions i, i + 1 from the
    counter RNG: identical for a seed on any machine (``slide.distributed`` draws single rows
    with it)."""
    s = stream_seed(seed, stream, i)
    s, a = splitmix64(s)
    s, b = splitmix64(s)
    r = np.sqrt(-2.0 * log_of_uniform((a >> np.uint64(11)) + np.uint64(1))) * std
    c, sn = cos_sin_turn(b)
    return np.float32(r * c), np.float32(r * sn)
