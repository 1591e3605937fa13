"""Rebuilding a ``Network`` from ``Network.state_dict()`` output, with validation."""
import numpy as np

STATE_FORMAT = 1


def _array(arrays, name, shape, dtype):
    if name not in arrays:
        raise ValueError(f"network state lacks array {name!r}")
    a = np.asarray(arrays[name])
    if a.shape != shape or a.dtype != dtype:
        raise ValueError(f"network state: {name!r} has shape {a.shape} and dtype {a.dtype}, "
                         f"expected {shape} {np.dtype(dtype)}")
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        raise ValueError(f"network state: {name!r} contains non-finite values")
    return a


def network_from_state(cls, state):
    """``cls.from_state(state)``: see ``Network.state_dict``."""
    from slide.lsh.index import LSHIndex
    if not isinstance(state, dict) or "meta" not in state or "arrays" not in state:
        raise ValueError("network state must be a dict with 'meta' and 'arrays'")
    meta, arrays = state["meta"], state["arrays"]
    need = ("format", "sizes", "sparse", "min_active", "loss", "seed", "lsh",
            "shared_negatives", "correct", "negative_power", "indices")
    missing = [k for k in need if k not in meta]
    if missing:
        raise ValueError(f"network state meta lacks {missing}")
    if meta["format"] != STATE_FORMAT:
        raise ValueError(f"unsupported network state format {meta['format']!r}")
    net = cls(meta["sizes"], meta["sparse"], meta["min_active"], loss=meta["loss"],
              seed=meta["seed"], lsh=meta["lsh"], init=False,
              shared_negatives=meta["shared_negatives"], correct=meta["correct"],
              negative_power=meta["negative_power"],
              # a state without it predates the head (slide.engine.negatives)
              shared_head=meta.get("shared_head", 0))
    net.W[:] = _array(arrays, "W", net.W.shape, net.W.dtype)
    net.B[:] = _array(arrays, "B", net.B.shape, net.B.dtype)
    if "neg_q" in arrays:
        q = _array(arrays, "neg_q", (int(net.n_out[-1]),), np.float64)
        net.negatives.set_distribution(q.copy())
    want = {l for l in range(net.layout.n_layers) if net.sparse[l]} if net.uses_tables else set()
    got = {int(l) for l in meta["indices"]}
    if got and got != want:
        raise ValueError(f"network state has LSH indices for layers {sorted(got)}, expected "
                         f"{sorted(want)}")
    for l in sorted(got):
        d = dict(meta["indices"][str(l)])
        prefix = f"lsh{l}_"
        d.update({k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)})
        idx = LSHIndex.from_state(d)
        if idx.dim != int(net.n_in[l]) or idx.n_neurons != int(net.n_out[l]):
            raise ValueError(f"network state: the LSH index of layer {l} does not fit the layer")
        net.indices[l] = idx
    net._pack_lsh()
    return net
