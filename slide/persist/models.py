"""``load``: the one module that knows the model classes. It reads any slide checkpoint --
a ``SlideClassifier`` file, a ``SlideEnsemble`` file (``slide.persist.checkpoint``'s format)
or a ``ShardedSlideClassifier`` directory (``slide.distributed.checkpoint``'s) -- validates it
and builds the model; the models' components restore their own parts. The formats record no
module or class names (JSON metadata and plain arrays, no pickles), so files written before
the package's modules moved load unchanged."""
import os

from slide.distributed.checkpoint import load_directory
from slide.distributed.estimator import ShardedSlideClassifier
from slide.ensemble import SlideEnsemble
from slide.estimator import SlideClassifier
from slide.text import pipeline_from_state
from slide.persist.archive import ArchiveArrays, CheckpointError, Unreadable, check_listed_arrays
from slide.persist.checkpoint import (ENSEMBLE_FORMAT, fused_ranking_from_arrays, load_model,
                                      open_checkpoint, pin_unrecorded_params)
from slide.rank.stack import RankStack


def load(path):
    """Load a model saved by ``SlideClassifier.save``, a ``SlideEnsemble`` saved by its
    ``save`` or, for a directory, the ``ShardedSlideClassifier`` saved there. Everything is
    validated before the model is built; any problem raises CheckpointError naming the file."""
    if os.path.isdir(os.fspath(path)):
        # a sharded model's checkpoint directory (slide.distributed.checkpoint)
        return load_sharded(path)
    npz, meta = open_checkpoint(path)
    try:
        arrays = ArchiveArrays(npz)
        if meta["format"] == ENSEMBLE_FORMAT:
            # the members' arrays are split by prefix: read them all (ensembles of small
            # members; a single model reads each array when it copies it)
            arrays = arrays.read_all()
        check_listed_arrays(path, meta, arrays)
        if meta["format"] == ENSEMBLE_FORMAT:
            model = _load_ensemble(path, meta, arrays)
        else:
            model = load_model(path, meta, arrays, SlideClassifier)
        if meta.get("text") is None:
            return model
        # a model that carries its vectorizer: the Pipeline (slide.text)
        return pipeline_from_state(model, meta["text"], arrays)
    except CheckpointError:
        raise
    except Unreadable as exc:
        raise CheckpointError(path, f"unreadable, truncated or corrupted ({exc})") from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise CheckpointError(path, f"invalid metadata ({type(exc).__name__}: {exc})") from None
    finally:
        npz.close()


def _load_ensemble(path, meta, arrays):
    n = int(meta["n_models"])
    if n < 1 or len(meta["members"]) != n:
        raise CheckpointError(path, f"ensemble of {n} members lists {len(meta['members'])}")
    members = []
    for k, member_meta in enumerate(meta["members"]):
        prefix = f"m{k}/"
        own = {name[len(prefix):]: a for name, a in arrays.items() if name.startswith(prefix)}
        check_listed_arrays(path, member_meta, own)
        members.append(load_model(path, member_meta, own, SlideClassifier))
    if len({(m.n_features_in_, m.n_labels_) for m in members}) != 1:
        raise CheckpointError(path, "ensemble members differ in their input or label count")
    template = pin_unrecorded_params(path, meta["estimator"], meta["version"])
    fused = meta.get("fused")       # files before fused ensembles have none
    ensemble = SlideEnsemble(estimator=_unfitted(template), n_models=n,
                             random_state=meta["random_state"], fused=fused is not None)
    ensemble.seed_ = int(meta["seed"])
    ensemble._set_members(members)
    if fused is not None:
        dim = sum(int(m.network_.layout.n_in[-1]) for m in members)
        memory, reranker = fused_ranking_from_arrays(path, fused, arrays, dim,
                                                     members[0].n_labels_,
                                                     members[0].n_features_in_)
        ensemble.order_seed_ = int(fused["order_seed"])
        ensemble.rank_ = RankStack(memory, reranker)
    ensemble.extra_ = meta.get("extra")
    return ensemble


def _unfitted(params):
    """The unfitted ``SlideClassifier`` of saved hyperparameters (JSON lists back to tuples)."""
    params = dict(params)
    for name in ("hidden_sizes", "sparse_layers"):
        if isinstance(params.get(name), list):
            params[name] = tuple(params[name])
    return SlideClassifier(**params)


def load_sharded(path, backend=None, ray_address=None):
    """A ``ShardedSlideClassifier`` from the checkpoint directory ``path`` (every shard read
    back by its own process). ``backend``: override the saved backend ("local" / "ray")."""
    return load_directory(path, ShardedSlideClassifier, backend, ray_address)
