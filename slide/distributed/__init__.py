"""Scale-out: the output layer sharded by label across processes (Ray actors) or in process.

``ShardedSlideClassifier(n_shards=4, ray_address=None, backend="ray", **SlideClassifier
parameters)`` trains the same network as ``SlideClassifier`` with its output layer split into
``n_shards`` contiguous label ranges, each with its own weights, LSH tables, shared negatives
and optimizer state (docs/distributed.md). Ray is imported only by the "ray" backend
(``pip install -e ".[distributed]"``).
"""
from importlib import import_module


_EXPORTS = {"ShardedSlideClassifier": "slide.distributed.estimator",
            "load": "slide.persist.models",
            "to_single": "slide.distributed.convert",
            "from_single": "slide.distributed.convert",
            "OutputShard": "slide.distributed.shard",
            "LocalBackend": "slide.distributed.backend"}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]),
                        "load_sharded" if name == "load" else name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'slide.distributed' has no attribute {name!r}")
