"""Pickling of ``SlideClassifier`` (``joblib.dump``, ``pickle``, ``copy.deepcopy``) through
its checkpoint format (``slide.persist.checkpoint``).

A fitted model's network holds Numba-compiled structures that do not pickle; its checkpoint
holds all its state (weights, optimizer, LSH tables, neighbour memory, re-ranker, label
names) and loads back bit-exact. So a fitted model pickles as the bytes of its checkpoint
plus its plain attributes that the checkpoint does not keep (``compile_seconds_`` and the
like); an unfitted one pickles as its attributes. A ``ShardedSlideClassifier`` saves a
directory: it pickles as its files, and unpickles with its shards started again on its
backend (Ray actors, or in process).
"""
import os
import tempfile

from slide.fileio import atomic_write
from slide.labels import set_classes
from slide.persist.archive import ArchiveArrays, check_listed_arrays
from slide.persist.checkpoint import load_model, open_checkpoint

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
    """The checkpoint of ``model`` as bytes: its file, or for a model saved as a directory
    (``ShardedSlideClassifier``) a dict of its files' names and bytes."""
    with tempfile.TemporaryDirectory(prefix="slide-pickle-") as tmp:
        path = os.path.join(tmp, "model.slide")
        model.save(path, extra=getattr(model, "extra_", None))
        if os.path.isdir(path):
            files = {}
            for name in sorted(os.listdir(path)):
                with open(os.path.join(path, name), "rb") as f:
                    files[name] = f.read()
            return files
        with open(path, "rb") as f:
            return f.read()


def from_bytes(data, cls):
    """The ``cls`` model of checkpoint bytes (``to_bytes``), read as ``slide.load`` reads a
    file (``slide.persist.checkpoint.load_model``) or, for a dict of files, as the class reads
    its checkpoint directory (``cls._load_directory``)."""
    with tempfile.TemporaryDirectory(prefix="slide-pickle-") as tmp:
        path = os.path.join(tmp, "model.slide")
        if isinstance(data, dict):
            os.makedirs(path)
            for name, content in data.items():
                if os.path.basename(name) != name or name in ("", ".", ".."):
                    raise ValueError(f"pickled checkpoint holds a file named {name!r}")
                with atomic_write(os.path.join(path, name), "wb") as f:
                    f.write(content)
            return cls._load_directory(path)
        with atomic_write(path, "wb") as f:      # slide writes files through fileio only
            f.write(data)
        npz, meta = open_checkpoint(path)
        try:
            arrays = ArchiveArrays(npz)
            check_listed_arrays(path, meta, arrays)
            return load_model(path, meta, arrays, cls)
        finally:
            npz.close()


def getstate(model):
    """``__getstate__`` of a ``SlideClassifier``."""
    if not model._built():
        return dict(model.__dict__)
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
    loaded = from_bytes(state[_KEY], type(model))
    keep = set(state["names"])
    model.__dict__.update({k: v for k, v in loaded.__dict__.items() if k in keep})
    # ``model`` owns the state now: the husk must not release it (a sharded model's __del__
    # stops its shards' processes) and what points back at the model must point at this one
    loaded.__dict__.clear()
    model._adopt_state()
    model.__dict__.update(state["attrs"])     # keywords as set, plain fitted attributes
    set_classes(model, state.get("classes"))
