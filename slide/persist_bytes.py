"""Pickling of ``SlideClassifier`` (``joblib.dump``, ``pickle``, ``copy.deepcopy``) through
its checkpoint format (``slide.checkpoint``).

A fitted model's network holds Numba-compiled structures that do not pickle; its checkpoint
holds all its state (weights, optimizer, LSH tables, neighbour memory, re-ranker, label
names) and loads back bit-exact. So a fitted model pickles as the bytes of its checkpoint
plus its plain attributes that the checkpoint does not keep (``compile_seconds_`` and the
like); an unfitted one pickles as its attributes.
"""
import os
import tempfile

from slide.fileio import atomic_write

_KEY = "__slide_checkpoint__"
_PLAIN = (bool, int, float, str, type(None))


def _plain(v):
    if isinstance(v, _PLAIN):
        return True
    if isinstance(v, (list, tuple)):
        return all(_plain(x) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _plain(x) for k, x in v.items())
    return False


def to_bytes(model):
    """The checkpoint file of ``model`` as bytes."""
    with tempfile.TemporaryDirectory(prefix="slide-pickle-") as tmp:
        path = os.path.join(tmp, "model.slide")
        model.save(path, extra=getattr(model, "extra_", None))
        with open(path, "rb") as f:
            return f.read()


def from_bytes(data):
    """The model of checkpoint bytes (``to_bytes``), through ``slide.checkpoint.load``."""
    from slide.checkpoint import load
    with tempfile.TemporaryDirectory(prefix="slide-pickle-") as tmp:
        path = os.path.join(tmp, "model.slide")
        with atomic_write(path, "wb") as f:      # slide writes files through fileio only
            f.write(data)
        return load(path)


def getstate(model):
    """``__getstate__`` of a ``SlideClassifier``."""
    if not model._built():
        return dict(model.__dict__)
    if not hasattr(model, "network_"):
        raise TypeError(f"a fitted {type(model).__name__} does not pickle (its state lives in "
                        f"other processes): save it with model.save(directory)")
    attrs = {k: v for k, v in model.__dict__.items() if _plain(v)}
    # the label names travel beside the checkpoint (pickle keeps any hashable name; slide's
    # format only strings and integers)
    named = bool(getattr(model, "named_labels_", False))
    model.named_labels_ = False
    try:
        data = to_bytes(model)
    finally:
        model.named_labels_ = named
    return {_KEY: data, "attrs": attrs, "names": list(model.__dict__),
            "classes": model.classes_ if named else None}


def setstate(model, state):
    """``__setstate__`` of a ``SlideClassifier``."""
    if _KEY not in state:
        model.__dict__.update(state)
        return
    loaded = from_bytes(state[_KEY])
    keep = set(state["names"])
    model.__dict__.update({k: v for k, v in loaded.__dict__.items() if k in keep})
    model.__dict__.update(state["attrs"])     # keywords as set, plain fitted attributes
    from slide.labels import set_classes
    set_classes(model, state.get("classes"))
