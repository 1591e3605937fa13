"""The checkpoint file format of ``SlideClassifier`` and ``SlideEnsemble`` (``model.save``;
``slide.load`` is ``slide.persist.models.load``, the one module that knows the model classes).
This module writes a model's parts and reads them back into a model built by ``load``; it
imports the components (LSH and serving indices, the neighbour memory, the re-ranker), never
the estimators.

One file, written atomically through ``slide.fileio.atomic_write``: an archive
(``slide.persist.archive``) whose JSON ``__meta__`` entry holds the format tag and version,
hyperparameters, sizes, seed, optimizer step, schedule state, epoch position, history and the
caller's ``extra``, and whose arrays are ``W``, ``B``, the optimizer's state (``opt_*``), each
LSH index's tables and hash parameters (``lsh<layer>_*``), the serving index of sparse
inference when one was built (``serve_*``, settings under ``serving``; optional, so older
files load) and the neighbour memory of the training rows when the model has one (``nbr_*``,
settings under ``neighbours``; optional likewise). ``load`` checks the format, the metadata
and every array's shape and dtype (from the headers) before it builds a model, then reads
each array as it copies it in, and raises :class:`CheckpointError` (a ``ValueError`` naming
the file) on a corrupt, truncated, mismatched or unsupported file.

Format versions: 2 adds ``opt_rates``, the rate of every optimizer step (read by the catch-up
of rows idle since an earlier step; version-1 files load with every past step at the base
rate, exact at a constant schedule); files without ``opt_TW`` / ``opt_TB`` load with every row
up to date. 3 to 6 each record one hyperparameter more; ``UNRECORDED_PARAMS`` pins one an
older file lacks to the behaviour of the code that wrote it, never to today's default. 7 is
a fused ensemble's file, 8 one saved without the optimizer's state (their constants say
why). A file of another version is refused with its version number.
"""
import json

import numpy as np

from slide import params as params_mod
from slide.fileio import atomic_write
from slide.kernels.lsh.index import LSHIndex
from slide.kernels.lsh.serving import ServingIndex
from slide.labels import fitted_on_1d, names_for_saving, set_classes, set_target
from slide.persist.archive import (ArchiveArrays, CheckpointError, Unreadable, open_archive,
                                   shape_dtype, write_archive)
from slide.rank.rerank import ReRanker
from slide.rank.vote import NeighbourMemory

VOTE_SETTINGS = ("neighbours", "neighbour_weight", "rerank")

FORMAT = "slide-checkpoint"
ENSEMBLE_FORMAT = "slide-ensemble"      # slide.ensemble.SlideEnsemble: members side by side
FORMAT_VERSION = 6
# a fused ensemble's file (its stacked network's ranking stages under fused/): a reader of
# version 6 would load its members without those stages, silently ranking otherwise; from 7 on
# it refuses the file instead. Its hyperparameters are recorded as version 6's.
FUSED_ENSEMBLE_VERSION = 7
# a file saved without the optimizer's state (``optimizer_state=False``): a reader of 7 or
# before would refuse it for its missing moments; from 8 on it loads a model that predicts and
# refuses to train on. Its hyperparameters are recorded as version 6's.
NO_OPTIMIZER_VERSION = 8
SUPPORTED_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8)

# The hyperparameters a checkpoint may not record, by the format version from which every file
# records them: a file of an older version was written by code that may have predated some of
# them (``params`` is the writer's ``get_params()``), and each one it lacks is pinned to the
# value that reproduces what that code did -- never to today's default, which would change a
# loaded model's predictions or its resumed training (rerank=True would hold out a tenth of
# rows the network already trained on). The commit that added each parameter, for the record.
# A parameter added later bumps FORMAT_VERSION and gets an entry under the new version.
UNRECORDED_PARAMS = {
    2: {
        "shared_negatives": 0,          # 602d820: no negatives shared by a batch before
        "sampling_correction": False,   # 28bf736: no logQ correction before
        "negative_power": 0.0,          # 5ae6175: shared negatives were uniform before
        "output_bias_init": "zero",     # 5ae6175: output biases started at zero before
        "lr_schedule": "constant",      # d1dff5a: a constant learning rate before
        "warmup_batches": 0,            # d1dff5a
        "time_budget": None,            # 492f367: no budget before
        "neighbours": 0,                # 753cf9e: exact predictions by the network alone
        "neighbour_weight": 0.85,       # 753cf9e (unused with neighbours=0)
        "rerank": False,                # 1d10254: no held-out rows, no re-ranker before
    },
    3: {
        "engine": "per_sample",         # round 3: every sample scored its own active set
    },
    4: {
        "exact_head": 0.0,              # round 3: every shared negative was drawn
    },
    5: {
        "max_row_labels": 0,            # round 3: the network trained on every label of a row
    },
    6: {
        "batches_in_flight": 1,         # round 4: one batch at a time
    },
}


def pin_unrecorded_params(path, params, version, names=None):
    """``params`` (a file's recorded hyperparameters, format ``version``) completed with
    UNRECORDED_PARAMS' value for each parameter of ``names`` (default: ``SlideClassifier``'s,
    the ``slide.params`` table's) that a file of that version may lack; CheckpointError
    naming a parameter it must record and does not."""
    params = dict(params)
    for name in sorted(params_mod.BY_NAME) if names is None else names:
        if name in params:
            continue
        pinned = [pins[name] for since, pins in sorted(UNRECORDED_PARAMS.items())
                  if version < since and name in pins]
        if not pinned:
            raise CheckpointError(path, f"the hyperparameter {name!r} is not recorded (a "
                                        f"format-{version} file records it)")
        params[name] = pinned[0]
    return params


# ---------------------------------------------------------------------------------------------
# writing

def _model_arrays(model, optimizer_state=True):
    net = model.network_
    arrays = {"W": net.W, "B": net.B}
    if optimizer_state:
        arrays.update(model.optimizer_.state_arrays())
        arrays["opt_rates"] = model.optimizer_.step_rates
    for l, idx in net.indices.items():
        _add_arrays(arrays, f"lsh{l}_", idx)
    rank = model.rank_
    for prefix, part in (("serve_", net.serving), ("nbr_", rank.memory),
                         ("rr_", rank.reranker)):
        if part is not None:
            _add_arrays(arrays, prefix, part)
    return arrays


def _settings(part):
    """The entries of ``part.state_dict()`` that are not arrays (None for no part)."""
    if part is None:
        return None
    return {k: v for k, v in part.state_dict().items() if not isinstance(v, np.ndarray)}


def _add_arrays(arrays, prefix, part):
    """arrays[prefix + key] = each array of ``part.state_dict()`` (its other entries are
    settings, written with the metadata)."""
    for k, v in part.state_dict().items():
        if isinstance(v, np.ndarray):
            arrays[f"{prefix}{k}"] = v


def _metadata(model, arrays, extra, optimizer_state=True):
    net = model.network_
    meta = {
        "format": FORMAT, "version": FORMAT_VERSION if optimizer_state else NO_OPTIMIZER_VERSION,
        # optional (files before it hold the state): the optimizer's moments and step records
        "optimizer_state": bool(optimizer_state),
        "params": model.get_params(deep=False),
        "sizes": list(net.layout.sizes),
        "sparse_layers": list(model.sparse_layers_),
        "seed": model.seed_,
        "opt_t": model.optimizer_.t,
        "batches": model.batches_, "samples": model.samples_,
        "epoch": model.epoch_, "batch_in_epoch": model.batch_in_epoch_,
        "train_seconds": model.train_seconds_,
        "schedule": model.schedule_.state(),
        "history": model.history_,
        "lsh": {str(l): _settings(idx) for l, idx in net.indices.items()},
        "serving": _settings(net.serving),
        "neighbours": _settings(model.rank_.memory),
        "reranker": _settings(model.rank_.reranker),
        "arrays": {k: [list(v.shape), str(v.dtype)] for k, v in arrays.items()},
        "extra": extra,
        # optional (files before it load as label ids): slide.labels
        "label_names": names_for_saving(model),
        # optional (files before it load as multi-label): fitted on a 1-D y (slide.labels)
        "one_label_per_row": fitted_on_1d(model),
    }
    # the vote's settings as fitted (predictions use them; a set_params after fit does not)
    meta["params"].update({name: getattr(model, name + "_") for name in VOTE_SETTINGS
                           if hasattr(model, name + "_")})
    # "auto" is saved as given (meta["sizes"] holds the width it gave)
    if meta["params"]["hidden_sizes"] != "auto":
        meta["params"]["hidden_sizes"] = list(model.hidden_sizes_)
    if meta["params"]["sparse_layers"] is not None:
        meta["params"]["sparse_layers"] = [int(v) for v in meta["params"]["sparse_layers"]]
    return meta


def _write_arrays(f, meta, arrays):
    """The archive itself (a test replaces this to fail half-way through a write)."""
    write_archive(f, meta, arrays)


def _with_optimizer_state(model, optimizer_state):
    """Whether ``model``'s file holds its optimizer's state: as asked, never for a model loaded
    without it. Without it the weights are synced first (pending steps applied, as predict's)."""
    if not isinstance(optimizer_state, (bool, np.bool_)):
        raise ValueError(f"optimizer_state must be True or False, got {optimizer_state!r}")
    keep = bool(optimizer_state) and model.optimizer_.has_state
    if not keep:
        model.sync()
    return keep


def save(model, path, extra=None, attachment=None, optimizer_state=True):
    """Write ``model``'s checkpoint to ``path`` atomically (the previous file survives any
    failure). ``attachment``: ``(meta, arrays)`` of the text steps in front of the model
    (``slide.text.pipeline_state``; ``load`` then returns the pipeline). ``optimizer_state``:
    False leaves out Adam's moments and step records (``NO_OPTIMIZER_VERSION``), a model to
    predict with that cannot train on."""
    if extra is not None:
        try:
            json.dumps(extra)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"extra must be JSON-serialisable: {exc}") from None
    keep = _with_optimizer_state(model, optimizer_state)
    arrays = _model_arrays(model, keep)
    if attachment is not None:
        arrays.update(attachment[1])
    meta = _metadata(model, arrays, extra, keep)
    if attachment is not None:
        meta["text"] = attachment[0]
    with atomic_write(path, "wb") as f:
        _write_arrays(f, meta, arrays)


def save_ensemble(ensemble, path, extra=None, attachment=None, optimizer_state=True):
    """Write a fitted ``SlideEnsemble`` to ``path`` atomically: one archive whose ``__meta__``
    holds the ensemble's parameters and each member's checkpoint metadata, and whose arrays
    are the members' (member k's under ``m<k>/``; ``attachment`` and ``optimizer_state`` as
    ``save``'s)."""
    if extra is not None:
        try:
            json.dumps(extra)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"extra must be JSON-serialisable: {exc}") from None
    arrays, members = {}, []
    for k, member in enumerate(ensemble.members_):
        keep = _with_optimizer_state(member, optimizer_state)
        own = _model_arrays(member, keep)
        members.append(_metadata(member, own, None, keep))
        arrays.update({f"m{k}/{name}": a for name, a in own.items()})
    template = {k: list(v) if isinstance(v, tuple) else v
                for k, v in ensemble._template().get_params(deep=False).items()}
    fused = None
    if ensemble._is_fused():
        # the stacked network's ranking stages (slide.fused), under fused/
        rank = ensemble.rank_
        fused = {"order_seed": ensemble.order_seed_,
                 "neighbours": _settings(rank.memory), "reranker": _settings(rank.reranker)}
        for prefix, part in (("fused/nbr_", rank.memory), ("fused/rr_", rank.reranker)):
            if part is not None:
                _add_arrays(arrays, prefix, part)
    if attachment is not None:
        arrays.update(attachment[1])
    versions = [FORMAT_VERSION if fused is None else FUSED_ENSEMBLE_VERSION]
    versions += [m["version"] for m in members]
    meta = {"format": ENSEMBLE_FORMAT, "version": max(versions),
            "n_models": len(members), "random_state": ensemble.random_state,
            "seed": ensemble.seed_, "estimator": template, "members": members,
            "fused": fused,
            "arrays": {k: [list(v.shape), str(v.dtype)] for k, v in arrays.items()},
            "extra": extra}
    if attachment is not None:
        meta["text"] = attachment[0]
    with atomic_write(path, "wb") as f:
        _write_arrays(f, meta, arrays)


# ---------------------------------------------------------------------------------------------
# reading

def open_checkpoint(path):
    """``(npz, meta)`` of a checkpoint file of a supported version, its archive left open."""
    return open_archive(path, (FORMAT, ENSEMBLE_FORMAT), SUPPORTED_VERSIONS)


def read(path):
    """``(meta, arrays)`` of a checkpoint file of a supported version; nothing is built."""
    npz, meta = open_checkpoint(path)
    try:
        return meta, ArchiveArrays(npz).read_all()
    except Unreadable as exc:
        raise CheckpointError(path, f"unreadable, truncated or corrupted ({exc})") from None
    finally:
        npz.close()


def load_model(path, meta, arrays, cls):
    """The ``cls`` (``SlideClassifier`` or a subclass: the caller names it, this module knows
    no model class) of one model's checkpoint entries, validated and restored."""
    model, sizes = _build_model(path, meta, cls)
    _check_state_arrays(path, meta, arrays, model, sizes)
    _restore(model, path, meta, arrays)
    return model


def _build_model(path, meta, cls):
    """An unfitted-then-built ``cls`` of the saved hyperparameters, sizes and seed (its
    weights still the fresh initialisation)."""
    params = pin_unrecorded_params(path, meta["params"], meta["version"])
    params["hidden_sizes"] = params_mod.hidden_sizes_value(params["hidden_sizes"])
    if params.get("sparse_layers") is not None:
        params["sparse_layers"] = tuple(params["sparse_layers"])
    model = cls(**params)
    hs, sparse = model._checked_params()
    sizes = [int(s) for s in meta["sizes"]]
    if hs == "auto" and len(sizes) == 3:
        hs = tuple(sizes[1:-1])         # the width "auto" gave when it was fitted
    if tuple(sizes[1:-1]) != tuple(hs) or list(sparse) != list(meta["sparse_layers"]):
        raise CheckpointError(path, "layer sizes in the metadata do not match the "
                                    "hyperparameters")
    model._build(sizes[0], sizes[-1], hs, sparse, seed=int(meta["seed"]))
    return model, sizes


def _check_state_arrays(path, meta, arrays, model, sizes):
    """Every array fits the built network and optimizer (fills in the step records of files
    written before they existed)."""
    net = model.network_
    for name, target in (("W", net.W), ("B", net.B)):
        if shape_dtype(arrays, name) != (target.shape, target.dtype):
            raise CheckpointError(path, f"array {name!r} does not fit the network {sizes}")
    if not meta.get("optimizer_state", True):
        return
    for name, target in model.optimizer_.state_arrays().items():
        if name not in arrays and name in ("opt_TW", "opt_TB"):
            # written before the step records existed: treat every row as up to date
            arrays[name] = np.full(target.shape, min(int(meta["opt_t"]), 2**31 - 1),
                                   dtype=target.dtype)
        if name not in arrays or shape_dtype(arrays, name) != (target.shape, target.dtype):
            raise CheckpointError(path, f"optimizer array {name!r} does not fit")
    steps = int(meta["opt_t"])
    if "opt_rates" in arrays:
        if shape_dtype(arrays, "opt_rates") != ((steps + 1,), np.dtype(np.float64)):
            raise CheckpointError(path, f"optimizer array 'opt_rates' does not fit (one "
                                        f"float64 rate per step: {steps + 1} entries)")
    elif meta["version"] >= 2:
        raise CheckpointError(path, "optimizer array 'opt_rates' is missing (format 2 "
                                    "records every step's rate)")


def _restore(model, path, meta, arrays):
    net = model.network_
    net.W[:] = arrays["W"]         # each array read once, where it is copied
    net.B[:] = arrays["B"]
    if not (np.isfinite(net.W).all() and np.isfinite(net.B).all()):
        raise CheckpointError(path, "weights contain non-finite values")
    opt = model.optimizer_
    if not meta.get("optimizer_state", True):
        opt.has_state = False   # the fresh optimizer's (no step pending); it cannot train on
    else:
        _restore_optimizer(opt, path, meta, arrays)
    restore_position(model, meta)
    model.schedule_.set_state(meta["schedule"])
    _load_lsh(model, path, meta.get("lsh", {}), arrays)
    _load_serving(model, path, meta.get("serving"), arrays)
    _load_memory(model, path, meta.get("neighbours"), arrays)
    _load_reranker(model, path, meta.get("reranker"), arrays)
    restore_labels(model, path, meta)
    model.extra_ = meta.get("extra")
    model.checkpoint_meta_ = meta


def restore_position(model, meta):
    """The training position a file records: batches, samples, epoch, place in it, clock."""
    model._set_position(batches=int(meta["batches"]), samples=int(meta["samples"]),
                        epoch=int(meta["epoch"]), batch_in_epoch=int(meta["batch_in_epoch"]),
                        train_seconds=float(meta["train_seconds"]),
                        history=list(meta["history"]))


def restore_labels(model, path, meta):
    """The label names and the target's form (1-D or multi-label) a file records."""
    try:
        set_classes(model, meta.get("label_names"))
    except ValueError as exc:
        raise CheckpointError(path, f"label names: {exc}") from None
    set_target(model, meta.get("one_label_per_row", False))


def _restore_optimizer(opt, path, meta, arrays):
    """The moments, step records and step rates of a file that holds them."""
    for name, target in opt.state_arrays().items():
        target[:] = arrays[name]
    if "opt_rates" in arrays:
        try:
            opt.set_step_rates(arrays["opt_rates"])
        except ValueError as exc:
            raise CheckpointError(path, str(exc)) from None
    else:
        # format 1 did not record the steps' rates: the base rate's, which that code's
        # first sync after a load used too (exact for a constant schedule)
        opt.set_step_rates(opt.constant_rates(int(meta["opt_t"])))


def _load_lsh(model, path, lsh_meta, arrays):
    """Restore the LSH tables exactly (they were built from older weights, so they cannot be
    recomputed from the saved ones)."""
    net = model.network_
    want = set(l for l in range(net.layout.n_layers) if net.sparse[l]) if net.uses_tables \
        else set()
    got = set(int(l) for l in lsh_meta)
    if want != got:
        raise CheckpointError(path, f"LSH state for layers {sorted(got)}, expected "
                                    f"{sorted(want)}")
    restored = {}
    for l in sorted(want):
        d = dict(lsh_meta[str(l)])
        prefix = f"lsh{l}_"
        for name in arrays:
            if name.startswith(prefix):
                d[name[len(prefix):]] = arrays[name]
        try:
            idx = LSHIndex.from_state(d)
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(path, f"LSH tables of layer {l}: {exc}") from None
        if idx.dim != int(net.n_in[l]) or idx.n_neurons != int(net.n_out[l]):
            raise CheckpointError(path, f"LSH tables of layer {l} do not fit the layer")
        restored[l] = idx
    net.set_indices(restored)


def _prefixed_state(path, settings, arrays, prefix, what):
    """The state dict of an optional part of a file: its ``settings`` (None: the file has no
    such part) plus its arrays named ``prefix*`` (prefix stripped). Arrays without settings
    are a corrupt file."""
    names = [n for n in arrays if n.startswith(prefix)]
    if settings is None:
        if names:
            raise CheckpointError(path, f"{what} arrays {sorted(names)} without settings")
        return None
    d = dict(settings)
    d.update({n[len(prefix):]: arrays[n] for n in names})
    return d


def _load_serving(model, path, serving_meta, arrays):
    """Restore the serving index of sparse inference, if the file has one (files written
    before it existed, or saved before any sparse prediction, have none: it is built on
    demand)."""
    d = _prefixed_state(path, serving_meta, arrays, "serve_", "serving index")
    if d is None:
        return
    try:
        ix = ServingIndex.from_state(d)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(path, f"serving index: {exc}") from None
    Wo, _ = model.network_.output_view()
    if not ix.fits(Wo):
        raise CheckpointError(path, "serving index does not fit the output layer")
    model.network_.serving = ix


def _load_memory(model, path, memory_meta, arrays):
    """Restore the neighbour memory (``slide.rank.vote``), if the file has one (files written
    before it existed, or by a model fitted with neighbours=0, have none)."""
    net = model.network_
    model.rank_.memory = memory_from_arrays(path, memory_meta, arrays, net.layout.n_in[-1],
                                            net.layout.n_out[-1])


def memory_from_arrays(path, memory_meta, arrays, dim, n_labels):
    """The ``NeighbourMemory`` saved as the ``nbr_*`` arrays and the ``memory_meta`` settings
    of a file (None when it has none), checked against the hidden width ``dim`` and the label
    count; CheckpointError naming ``path`` otherwise. Shared by single and sharded models."""
    d = _prefixed_state(path, memory_meta, arrays, "nbr_", "neighbour memory")
    if d is None:
        return None
    try:
        mem = NeighbourMemory.from_state(d)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(path, f"neighbour memory: {exc}") from None
    if not mem.fits(dim, n_labels):
        raise CheckpointError(path, "neighbour memory does not fit the network")
    return mem


def fused_ranking_from_arrays(path, fused_meta, arrays, dim, n_labels, n_features):
    """The (neighbour memory, re-ranker) of a fused ensemble's stacked network (``dim``: the
    members' hidden widths summed), saved under ``fused/``; CheckpointError naming ``path``."""
    own = {n[len("fused/"):]: a for n, a in arrays.items() if n.startswith("fused/")}
    memory = memory_from_arrays(path, fused_meta.get("neighbours"), own, dim, n_labels)
    return memory, _reranker_from_arrays(path, fused_meta.get("reranker"), own, memory,
                                         n_labels, n_features)


def _load_reranker(model, path, reranker_meta, arrays):
    """Restore the re-ranker (``slide.rank.rerank``), if the file has one (files written before it
    existed, or by a model fitted without one, have none). It needs the neighbour memory."""
    net = model.network_
    model.rank_.reranker = _reranker_from_arrays(path, reranker_meta, arrays,
                                                 model.rank_.memory, net.layout.n_out[-1],
                                                 net.layout.sizes[0])


def _reranker_from_arrays(path, reranker_meta, arrays, memory, n_labels, n_features):
    """The ``ReRanker`` saved as the ``rr_*`` arrays and ``reranker_meta`` settings (None when
    the file has none), over ``memory`` (the neighbour memory it needs); CheckpointError
    naming ``path`` otherwise."""
    d = _prefixed_state(path, reranker_meta, arrays, "rr_", "re-ranker")
    if d is None:
        return None
    if memory is None:
        raise CheckpointError(path, "re-ranker without the neighbour memory it ranks")
    try:
        return ReRanker.from_state(d, int(n_labels), int(n_features))
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(path, f"re-ranker: {exc}") from None
