"""Counter-based random numbers for Numba kernels, and the one table of stream ids.

Every random draw inside a kernel comes from ``splitmix64`` applied to a 64-bit counter that the
caller derives from (seed, stream, index) -- for example (estimator seed, batch serial, sample
position). A draw therefore does not depend on which thread runs the sample, so one-thread runs
are bit-reproducible and multi-thread runs differ only through HOGWILD races, never through
thread scheduling of the random streams.
"""
import numpy as np

from slide.kernels.jit import njit


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)

# ----------------------------------------------------------------------------------------------
# Stream ids: what a draw is for. Every ``stream_seed`` call in slide names one of these, so two
# purposes never share a sequence by accident. The values are fixed by the trained models and
# checkpoints they reproduce (tests/test_golden.py): never renumber one without regenerating it.
#
# Disjointness rule (tests/test_rng.py enumerates it): the two per-serial families take every id
# ``base + 16 * serial`` (serial >= 0, unbounded), i.e. all ids >= base of residue 7 (training)
# or 12 (sparse inference) modulo 16; every other stream is a fixed id (or, for the layer
# weights, ``init_stream(l)``) of another residue. Until issue 28, DOPH (103 = 7 + 16 * 6), the
# table seed (203 = 11 + 16 * 12) and layer l = 3, 7, 15, ... (1015 = 7 + 16 * 63) shared ids
# with the per-serial streams; 103 and the sparse-inference base moved, layers 0-3 kept theirs.
# ----------------------------------------------------------------------------------------------
STREAM_SAMPLE = 7            # engine, per (batch serial, sample position): sampler, random fill;
STREAM_PREDICT = 12          # engine, per (call, sample) at sparse inference; both are offset
STREAM_SERIAL_STRIDE = 16    # by serial * 16 (call * 16), so each batch has its own stream
SERIAL_RESIDUES = (STREAM_SAMPLE % STREAM_SERIAL_STRIDE, STREAM_PREDICT % STREAM_SERIAL_STRIDE)
STREAM_SIMHASH = 101         # lsh.hashes: SimHash projection keys
STREAM_DWTA = 102            # lsh.hashes: DWTA probe key
STREAM_DOPH = 104            # lsh.hashes: DOPH per-table keys (103 until issue 28)
STREAM_ORDER = 201           # lsh.index: insertion order of a table
STREAM_RESERVOIR = 202       # lsh.index: reservoir draws of a table
STREAM_TABLE_SEED = 203      # lsh.index: table seed of a build generation
STREAM_SAMPLE_BATCH = 301    # lsh.samplers.sample_batch: per query row
STREAM_LAYER_SEED = 500      # engine: hash-function seed of a sparse layer's index
STREAM_REBUILD = 501         # lsh.index: seed of the next hash functions at a rebuild
STREAM_SHARD_SEED = 600      # distributed.shard: seed of shard q > 0
STREAM_INIT = 1000           # layers.init_params: weights of layer l use init_stream(l)
FIXED_STREAMS = (STREAM_SIMHASH, STREAM_DWTA, STREAM_DOPH, STREAM_ORDER, STREAM_RESERVOIR,
                 STREAM_TABLE_SEED, STREAM_SAMPLE_BATCH, STREAM_LAYER_SEED, STREAM_REBUILD,
                 STREAM_SHARD_SEED)


def init_stream(layer):
    """Stream id of layer ``layer``'s initial weights: STREAM_INIT + layer for layers 0-3 (the
    ids every model so far was initialised with), then four ids per 16 (residues 8-11 modulo
    16), so that no layer count reaches a per-serial stream (residues 7 and 12)."""
    layer = int(layer)
    if layer < 0:
        raise ValueError(f"layer must be >= 0, got {layer}")
    return STREAM_INIT + STREAM_SERIAL_STRIDE * (layer // 4) + layer % 4


# engine: numpy Generator key (seed, serial, key) of a batch's shared negatives (drawn in
# Python, not by the counter RNG)
SHARED_NEGATIVES_KEY = 0x5EED
# lsh.serving: numpy Generator key (seed, key) of the serving index's projections
SERVING_INDEX_KEY = 0x5E7E


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
    """A well-mixed uint64 starting state for draw sequence ``index`` of ``stream`` under
    ``seed``."""
    s = np.uint64(seed)
    s, a = splitmix64(s ^ (np.uint64(stream) * _MIX1))
    s, b = splitmix64(a ^ (np.uint64(index) * _MIX2))
    return b


def derived_seed(seed, stream, index=0):
    """A non-negative Python int seed (63 bits) derived from ``seed`` for ``stream``/``index``:
    the seed of a layer's hash functions, or of the next ones at a rebuild."""
    return int(stream_seed(np.uint64(seed), stream, index)) >> 1


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
