"""Checkpoints of a sharded model: a directory with one file per shard (written by the shard
itself, atomically, through ``slide.fileio``), the driver's file, and ``manifest.json``
written LAST. File names carry the batch serial, so a save that fails half-way leaves the
previous manifest and every file it lists intact; files no manifest lists are removed after a
successful save.

``load(path)`` reassembles a ``ShardedSlideClassifier``; ``to_single(model)`` gives the
equivalent ``SlideClassifier`` (one process, for serving or further training; its LSH tables
are rebuilt from the weights), ``from_single(model, n_shards)`` the reverse.
"""
import json
import os

import numpy as np

from slide.checkpoint import VOTE_SETTINGS, CheckpointError, pin_unrecorded_params
from slide.labels import names_for_saving, set_classes
from slide.fileio import atomic_write, write_text

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
            "n_features": model.n_features_in_, "n_labels": model.n_labels_,
            "bounds": [int(b) for b in model.bounds_], "opt_t": hid.optimizer.t,
            "batches": model.batches_, "samples": model.samples_, "epoch": model.epoch_,
            "batch_in_epoch": model.batch_in_epoch_, "train_seconds": model.train_seconds_,
            "history": model.history_, "schedule": model.schedule_.state()}
    meta["params"]["hidden_sizes"] = list(model.hidden_sizes_)
    meta["params"].update({name: getattr(model, name + "_") for name in VOTE_SETTINGS
                           if hasattr(model, name + "_")})
    arrays = {k: v for k, v in hid.state_arrays().items()}
    arrays["opt_rates"] = hid.optimizer.step_rates
    mem = getattr(model, "memory_", None)
    meta["neighbours"] = None
    if mem is not None:
        # the neighbour vote's memory (slide.neighbours), kept by the driver
        d = mem.state_dict()
        meta["neighbours"] = {k: v for k, v in d.items() if not isinstance(v, np.ndarray)}
        arrays.update({f"nbr_{k}": v for k, v in d.items() if isinstance(v, np.ndarray)})
    return {"meta": meta, "arrays": arrays}


def save(model, path, extra=None):
    """Write ``model`` (a fitted ``ShardedSlideClassifier``) into the directory ``path``."""
    if extra is not None:
        json.dumps(extra)
    path = os.fspath(path)
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
    model._set_position(batches=int(meta["batches"]), samples=int(meta["samples"]),
                        epoch=int(meta["epoch"]), batch_in_epoch=int(meta["batch_in_epoch"]),
                        train_seconds=float(meta["train_seconds"]),
                        history=list(meta["history"]))
    try:
        set_classes(model, meta.get("label_names"))
    except ValueError as exc:
        raise CheckpointError(path, f"label names: {exc}") from None
    model.extra_ = man.get("extra")


def _restore_memory(model, path, memory_meta, arrays):
    """The driver's neighbour memory, if the file has one."""
    from slide.checkpoint import memory_from_arrays
    model.memory_ = memory_from_arrays(path, memory_meta, arrays, model.hidden_sizes_[-1],
                                       model.n_labels_)


def load(path, backend=None, ray_address=None):
    """A ``ShardedSlideClassifier`` from the checkpoint directory ``path`` (every shard read
    back by its own process). ``backend``: override the saved backend ("local" / "ray")."""
    from slide.distributed.estimator import ShardedSlideClassifier
    path = os.fspath(path)
    man = read_manifest(path)
    dmeta = read_part(os.path.join(path, man["driver"]))["meta"]
    # the sharded format has not changed since before the vote and its re-ranker existed: a
    # parameter its driver file lacks gets the behaviour of the code that wrote it, as a
    # format-1 single-process file's does (slide.checkpoint.UNRECORDED_PARAMS)
    params = pin_unrecorded_params(os.path.join(path, man["driver"]), dmeta["params"], 1)
    params["hidden_sizes"] = tuple(params["hidden_sizes"])
    if backend is not None:
        params["backend"] = backend
    if ray_address is not None:
        params["ray_address"] = ray_address
    model = ShardedSlideClassifier(**params)
    hs, sparse = model._checked_params()
    model._build(dmeta["n_features"], dmeta["n_labels"], hs, sparse, seed=dmeta["seed"],
                 shard_files=[os.path.join(path, n) for n in man["shards"]])
    restore_driver(model, path, man)
    model.last_checkpoint_ = path
    return model


def to_single(model):
    """The ``SlideClassifier`` holding the same weights, optimizer state and position as the
    sharded ``model`` (LSH tables rebuilt from the weights: the shards' tables use their own
    hash functions)."""
    from slide.estimator import SlideClassifier
    params = {k: v for k, v in model.get_params(deep=False).items()
              if k not in model._extra_params}
    single = SlideClassifier(**params)
    hs, sparse = single._checked_params()
    single._build(model.n_features_in_, model.n_labels_, hs, sparse, seed=model.seed_)
    net, opt, hid = single.network_, single.optimizer_, model.hidden_
    lay = net.layout
    n0w, n0b = int(lay.w_off[1]), int(lay.b_off[1])
    parts = model.backend_.call_all("state_dict")
    net.W[:n0w] = hid.W
    net.B[:n0b] = hid.B
    net.W[n0w:] = np.concatenate([p["arrays"]["net_W"][hs[0]:] for p in parts])
    net.B[n0b:] = np.concatenate([p["arrays"]["net_B"][hs[0]:] for p in parts])
    r0 = int(lay.row_off[1])
    for name, target in opt.state_arrays().items():
        if target.shape[0] == 0:
            continue
        mine = hid.optimizer.state_arrays()[name]
        cut = {"opt_MW": n0w, "opt_VW": n0w, "opt_MB": n0b, "opt_VB": n0b, "opt_TW": r0,
               "opt_TB": n0b}[name]
        skip = {"opt_MW": hs[0], "opt_VW": hs[0], "opt_MB": hs[0], "opt_VB": hs[0],
                "opt_TW": 1, "opt_TB": hs[0]}[name]
        target[:cut] = mine
        target[cut:] = np.concatenate([p["arrays"][f"opt_{name}"][skip:] for p in parts])
    opt.set_step_rates(hid.optimizer.step_rates)
    single._set_position(batches=model.batches_, samples=model.samples_, epoch=model.epoch_,
                         batch_in_epoch=model.batch_in_epoch_,
                         train_seconds=model.train_seconds_, history=list(model.history_))
    single._ensure_lsh()
    single.network_.memory = getattr(model, "memory_", None)
    set_classes(single, model.classes_ if model.named_labels_ else None)
    return single


def from_single(single, n_shards, backend="local", ray_address=None):
    """A ``ShardedSlideClassifier`` with the weights and optimizer state of ``single`` (a
    fitted one-hidden-layer ``SlideClassifier``), its output layer split into ``n_shards``."""
    import tempfile
    from slide.distributed.estimator import ShardedSlideClassifier
    from slide.distributed.shard import OutputShard, shard_ranges
    single._check_fitted()
    model = ShardedSlideClassifier(n_shards=n_shards, backend=backend, ray_address=ray_address,
                                   **single.get_params(deep=False))
    hs, sparse = model._checked_params()
    lay = single.network_.layout
    H = hs[0]
    n0w, n0b, r0 = int(lay.w_off[1]), int(lay.b_off[1]), int(lay.row_off[1])
    model.seed_, model.n_features_in_ = single.seed_, single.n_features_in_
    cfg = None
    files = []
    with tempfile.TemporaryDirectory() as tmp:
        ranges = shard_ranges(single.n_labels_, n_shards)
        for q, (lo, hi) in enumerate(ranges):
            if cfg is None:
                cfg = model.shard_config()
            sh = OutputShard(q, lo, hi, H, single.n_labels_, cfg, init=False)
            Wo, bo = single.network_.output_view()
            sw, sb = sh.net.output_view()
            sw[:] = Wo[lo:hi]
            sb[:] = bo[lo:hi]
            so, o = sh.opt.state_arrays(), single.optimizer_.state_arrays()
            for name in ("opt_MW", "opt_VW"):
                if so[name].shape[0]:
                    so[name][H:] = o[name][n0w + lo * H:n0w + hi * H]
            for name in ("opt_MB", "opt_VB", "opt_TB"):
                if so[name].shape[0]:
                    so[name][H:] = o[name][n0b + lo:n0b + hi]
            if so["opt_TW"].shape[0]:
                so["opt_TW"][1:] = o["opt_TW"][r0 + lo:r0 + hi]
            sh.opt.set_step_rates(single.optimizer_.step_rates)
            sh.schedule.set_state(single.schedule_.state())
            files.append(os.path.join(tmp, f"shard-{q}.npz"))
            write_part(files[-1], sh.state_dict())
        model._build(single.n_features_in_, single.n_labels_, hs, sparse, seed=single.seed_,
                     shard_files=files)
    hid = model.hidden_
    hid.W[:] = single.network_.W[:n0w]
    hid.B[:] = single.network_.B[:n0b]
    o = single.optimizer_.state_arrays()
    cuts = {"opt_MW": n0w, "opt_VW": n0w, "opt_MB": n0b, "opt_VB": n0b, "opt_TW": r0,
            "opt_TB": n0b}
    for name, target in hid.optimizer.state_arrays().items():
        if target.shape[0]:
            target[:] = o[name][:cuts[name]]
    hid.optimizer.set_step_rates(single.optimizer_.step_rates)
    model.schedule_.set_state(single.schedule_.state())
    model._set_position(batches=single.batches_, samples=single.samples_, epoch=single.epoch_,
                        batch_in_epoch=single.batch_in_epoch_,
                        train_seconds=single.train_seconds_, history=list(single.history_))
    model.memory_ = single.network_.memory
    set_classes(model, single.classes_ if single.named_labels_ else None)
    return model
