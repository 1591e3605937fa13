"""Counter-based random numbers for Numba kernels.

Every random draw inside a kernel comes from ``splitmix64`` applied to a 64-bit counter that the
caller derives from (seed, stream, index) -- for example (estimator seed, batch serial, sample
position). A draw therefore does not depend on which thread runs the sample, so one-thread runs
are bit-reproducible and multi-thread runs differ only through HOGWILD races, never through
thread scheduling of the random streams.
"""
import numpy as np
from numba import njit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@njit(cache=True, nogil=True, inline="always")
def splitmix64(state):
    """Advance ``state`` (uint64) and return ``(new_state, random uint64)``."""
    state = state + _GOLDEN
    z = state
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    z = z ^ (z >> np.uint64(31))
    return state, z


@njit(cache=True, nogil=True)
def stream_seed(seed, stream, index):
    """A well-mixed uint64 starting state for draw sequence ``index`` of ``stream`` under ``seed``."""
    s = np.uint64(seed)
    s, a = splitmix64(s ^ (np.uint64(stream) * _MIX1))
    s, b = splitmix64(a ^ (np.uint64(index) * _MIX2))
    return b


@njit(cache=True, nogil=True, inline="always")
def randint(state, high):
    """Return ``(new_state, r)`` with r uniform in [0, high) (high > 0, below 2**32)."""
    state, z = splitmix64(state)
    # multiply-shift: unbiased enough for high << 2**32 and free of a slow modulo
    r = np.int64(((z >> np.uint64(32)) * np.uint64(high)) >> np.uint64(32))
    return state, r


@njit(cache=True, nogil=True, inline="always")
def uniform(state):
    """Return ``(new_state, u)`` with u uniform in [0, 1)."""
    state, z = splitmix64(state)
    return state, np.float64(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)
