"""Checkpoints of a sharded model: a directory with one file per shard (written by the shard
itself, atomically, through ``slide.fileio``), the driver's file, and ``manifest.json``
written LAST. File names carry the batch serial, so a save that fails half-way leaves the
previous manifest and every file it lists intact; files no manifest lists are removed after a
successful save.

``load_directory`` (``slide.load`` of a directory, ``slide.persist.models.load_sharded``)
reassembles a ``ShardedSlideClassifier`` from them; ``slide.distributed.convert`` turns one into a
``SlideClassifier`` and back.
"""
import errno
import json
import os

import numpy as np

from slide.fileio import atomic_write, write_text
from slide.labels import fitted_on_1d, names_for_saving
from slide.params import hidden_sizes_value
from slide.persist.checkpoint import (VOTE_SETTINGS, CheckpointError, memory_from_arrays,
                                      pin_unrecorded_params, restore_labels, restore_position)


MANIFEST = "manifest.json"
FORMAT = "slide-sharded-checkpoint"
FORMAT_VERSION = 1


def write_part(path, state):
    """One state dict ({"meta", "arrays"}) as an npz file with a JSON ``__meta__``."""
    meta = np.frombuffer(json.dumps(state["meta"]).encode(), dtype=np.uint8)
    with atomic_write(path, "wb") as f:
        np.savez(f, __meta__=meta, **state["arrays"])
    return os.path.basename(path)


def read_part(path):
    if not os.path.isfile(path):
        raise CheckpointError(path, "no such file (a shard of this checkpoint is missing)")
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(z["__meta__"].tobytes().decode())
            arrays = {k: z[k] for k in z.files if k != "__meta__"}
    except (OSError, ValueError, KeyError, EOFError) as exc:
        raise CheckpointError(path, f"unreadable, truncated or corrupted ({exc})") from None
    return {"meta": meta, "arrays": arrays}


def _driver_state(model):
    hid = model.hidden_
    meta = {"params": model.get_params(deep=False), "seed": model.seed_,
            "label_names": names_for_saving(model),
            "one_label_per_row": fitted_on_1d(model),
            "n_features": model.n_features_in_, "n_labels": model.n_labels_,
            "bounds": [int(b) for b in model.bounds_], "opt_t": hid.optimizer.t,
            "batches": model.batches_, "samples": model.samples_, "epoch": model.epoch_,
            "batch_in_epoch": model.batch_in_epoch_, "train_seconds": model.train_seconds_,
            "history": model.history_, "schedule": model.schedule_.state()}
    meta["hidden_sizes"] = list(model.hidden_sizes_)       # as fitted, whatever "auto" gives
    if meta["params"]["hidden_sizes"] != "auto":
        meta["params"]["hidden_sizes"] = list(model.hidden_sizes_)
    meta["params"].update({name: getattr(model, name + "_") for name in VOTE_SETTINGS
                           if hasattr(model, name + "_")})
    arrays = {k: v for k, v in hid.state_arrays().items()}
    arrays["opt_rates"] = hid.optimizer.step_rates
    mem = model.rank_.memory
    meta["neighbours"] = None
    if mem is not None:
        # the neighbour vote's memory (slide.rank.vote), kept by the driver
        d = mem.state_dict()
        meta["neighbours"] = {k: v for k, v in d.items() if not isinstance(v, np.ndarray)}
        arrays.update({f"nbr_{k}": v for k, v in d.items() if isinstance(v, np.ndarray)})
    return {"meta": meta, "arrays": arrays}


def save(model, path, extra=None):
    """Write ``model`` (a fitted ``ShardedSlideClassifier``) into the directory ``path``."""
    if extra is not None:
        json.dumps(extra)
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotADirectoryError(errno.ENOTDIR, "a sharded model saves into a directory; this "
                                 "is a file", path)
    os.makedirs(path, exist_ok=True)
    tag = f"b{model.batches_:09d}"
    S = model.backend_.n_shards
    names = model.backend_.call_each(
        "save_part", [(os.path.join(path, f"shard-{q:04d}-{tag}.npz"),) for q in range(S)])
    driver = write_part(os.path.join(path, f"driver-{tag}.npz"), _driver_state(model))
    manifest = {"format": FORMAT, "version": FORMAT_VERSION, "n_shards": S,
                "bounds": [int(b) for b in model.bounds_], "driver": driver,
                "shards": list(names), "batches": model.batches_, "extra": extra}
    write_text(os.path.join(path, MANIFEST), json.dumps(manifest, indent=1))
    keep = set(names) | {driver, MANIFEST}
    for f in os.listdir(path):
        if f.endswith(".npz") and f not in keep and (f.startswith("shard-") or
                                                     f.startswith("driver-")):
            os.remove(os.path.join(path, f))
    model.last_checkpoint_ = path


def read_manifest(path):
    path = os.fspath(path)
    mpath = os.path.join(path, MANIFEST)
    if not os.path.isfile(mpath):
        raise CheckpointError(path, f"not a sharded checkpoint (no {MANIFEST})")
    try:
        with open(mpath) as f:
            man = json.load(f)
    except (OSError, ValueError) as exc:
        raise CheckpointError(mpath, f"unreadable manifest ({exc})") from None
    if man.get("format") != FORMAT or man.get("version") != FORMAT_VERSION:
        raise CheckpointError(mpath, f"not a version-{FORMAT_VERSION} sharded checkpoint")
    if len(man["shards"]) != man["n_shards"]:
        raise CheckpointError(mpath, "the manifest lists the wrong number of shards")
    for name in [man["driver"]] + list(man["shards"]):
        if not os.path.isfile(os.path.join(path, name)):
            raise CheckpointError(os.path.join(path, name),
                                  "no such file (a part of this sharded checkpoint is missing)")
    return man


def load_directory(path, cls, backend=None, ray_address=None):
    """A ``cls`` (``ShardedSlideClassifier``) model from the checkpoint directory ``path``,
    every shard read back by its own process; ``backend`` / ``ray_address`` override the
    saved ones. (The class is an argument: its module imports this one.)"""
    path = os.fspath(path)
    man = read_manifest(path)
    dmeta = read_part(os.path.join(path, man["driver"]))["meta"]
    # the sharded format has not changed since before the vote and its re-ranker existed: a
    # parameter its driver file lacks gets the behaviour of the code that wrote it, as a
    # format-1 single-process file's does (slide.persist.checkpoint.UNRECORDED_PARAMS)
    params = pin_unrecorded_params(os.path.join(path, man["driver"]), dmeta["params"], 1)
    params["hidden_sizes"] = hidden_sizes_value(params["hidden_sizes"])
    if backend is not None:
        params["backend"] = backend
    if ray_address is not None:
        params["ray_address"] = ray_address
    model = cls(**params)
    hs, sparse = model._checked_params()
    if hs == "auto":
        hs = tuple(int(h) for h in dmeta["hidden_sizes"])
    model._build(dmeta["n_features"], dmeta["n_labels"], hs, sparse, seed=dmeta["seed"],
                 shard_files=[os.path.join(path, n) for n in man["shards"]])
    restore_driver(model, path, man)
    model.last_checkpoint_ = path
    return model


def restore_driver(model, path, man):
    """Install the driver's saved state into ``model`` (built with the same sizes)."""
    st = read_part(os.path.join(path, man["driver"]))
    meta, arrays = st["meta"], st["arrays"]
    hid = model.hidden_
    _restore_memory(model, os.path.join(path, man["driver"]), meta.get("neighbours"), arrays)
    for name, target in hid.state_arrays().items():
        a = arrays.get(name)
        if a is None or a.shape != target.shape:
            raise CheckpointError(path, f"driver array {name!r} is missing or does not fit")
        target[...] = a
    rates = arrays.get("opt_rates")
    if rates is None:
        # written before the optimizer recorded its steps' rates: as at the base rate
        rates = hid.optimizer.constant_rates(int(meta["opt_t"]))
    if rates.shape != (int(meta["opt_t"]) + 1,):
        raise CheckpointError(path, f"driver array 'opt_rates' has shape {rates.shape}, "
                                    f"expected ({int(meta['opt_t']) + 1},)")
    try:
        hid.optimizer.set_step_rates(rates)
    except ValueError as exc:
        raise CheckpointError(path, f"driver: {exc}") from None
    model.schedule_.set_state(meta["schedule"])
    # the touched-row stamps hold batch serials: after a rollback the same serials come again
    hid.reset_stamps()
    restore_position(model, meta)
    restore_labels(model, path, meta)
    model.extra_ = man.get("extra")


def _restore_memory(model, path, memory_meta, arrays):
    """The driver's neighbour memory, if the file has one."""
    model.rank_.memory = memory_from_arrays(path, memory_meta, arrays, model.hidden_sizes_[-1],
                                            model.n_labels_)
