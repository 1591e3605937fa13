"""The stream ids of slide.kernels.rng: no two purposes may ever draw the same sequence."""
import pytest

from slide.kernels import rng as _rng
from slide import params


def _serial_family(base, n):
    return {base + _rng.STREAM_SERIAL_STRIDE * s for s in range(n)}


def test_stream_id_ranges_are_disjoint():
    """Enumerates every stream id a run can use up to far more batches, predict calls and
    layers than a test trains (the residue rule in slide.kernels.rng extends it to any count)."""
    n_serials, n_layers = 100_000, 1_000
    families = {
        "sample (per batch serial)": _serial_family(_rng.STREAM_SAMPLE, n_serials),
        "predict (per call)": _serial_family(_rng.STREAM_PREDICT, n_serials),
        "init (per layer)": {_rng.init_stream(l) for l in range(n_layers)},
    }
    assert len(families["init (per layer)"]) == n_layers
    for sid in _rng.FIXED_STREAMS:
        families[f"fixed {sid}"] = {sid}
    assert len(_rng.FIXED_STREAMS) == len(set(_rng.FIXED_STREAMS))
    names = list(families)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not families[a] & families[b], (a, b, sorted(families[a] & families[b])[:5])


def test_the_residue_rule_covers_any_serial():
    """The per-serial families are exactly the ids >= base of their residue modulo 16: no fixed
    or layer stream may have one of those residues (at or above its base)."""
    stride = _rng.STREAM_SERIAL_STRIDE
    bases = (_rng.STREAM_SAMPLE, _rng.STREAM_PREDICT)
    assert len({b % stride for b in bases}) == 2 and all(b < stride for b in bases)
    others = list(_rng.FIXED_STREAMS) + [_rng.init_stream(l) for l in range(64)]
    for sid in others:
        assert sid % stride not in _rng.SERIAL_RESIDUES, sid
    # layers 0-3 keep the ids every model so far was initialised with
    assert [_rng.init_stream(l) for l in range(4)] == [1000, 1001, 1002, 1003]
    with pytest.raises(ValueError):
        _rng.init_stream(-1)


def test_batch_size_keeps_the_active_set_stamps_unique():
    """The kernels stamp a sample's marks serial * 2**20 + position + 1: unique while a batch
    has at most 2**20 samples (positions 0 .. 2**20 - 1)."""
    bound = params.BY_NAME["batch_size"].le
    assert bound is not None and bound < 2**20
    stamps = {serial * 1048576 + s + 1 for serial in range(3) for s in (0, 1, bound - 1)}
    assert len(stamps) == 9
    from slide.estimator import SlideClassifier
    import numpy as np
    X = np.eye(4, dtype=np.float32)
    with pytest.raises(ValueError, match="batch_size"):
        SlideClassifier(batch_size=2**20).fit(X, [[0], [1], [2], [3]])
    _, problem = params.check_value(params.BY_NAME["batch_size"], 2**20 - 1)
    assert not problem
