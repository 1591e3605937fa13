"""Conversions between a sharded model and the single-process one: ``to_single(model)`` gives
the equivalent ``SlideClassifier`` (one process, for serving or further training; its LSH
tables are rebuilt from the weights), ``from_single(model, n_shards)`` the reverse."""
import os
import tempfile

import numpy as np

from slide.distributed.checkpoint import write_part
from slide.distributed.estimator import ShardedSlideClassifier
from slide.distributed.shard import OutputShard, shard_ranges
from slide.estimator import SlideClassifier
from slide.labels import fitted_on_1d, set_classes, set_target


def to_single(model):
    """The ``SlideClassifier`` holding the same weights, optimizer state and position as the
    sharded ``model`` (LSH tables rebuilt from the weights: the shards' tables use their own
    hash functions)."""
    params = {k: v for k, v in model.get_params(deep=False).items()
              if k not in model._extra_params}
    single = SlideClassifier(**params)
    _, sparse = single._checked_params()
    hs = model.hidden_sizes_                # as fitted ("auto" resolved)
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
    single.rank_.memory = model.rank_.memory
    set_classes(single, model.classes_ if model.named_labels_ else None)
    set_target(single, fitted_on_1d(model))
    return single


def from_single(single, n_shards, backend="local", ray_address=None):
    """A ``ShardedSlideClassifier`` with the weights and optimizer state of ``single`` (a
    fitted one-hidden-layer ``SlideClassifier``), its output layer split into ``n_shards``."""
    single._check_fitted()
    if not single.optimizer_.has_state:
        raise ValueError("from_single: this model was saved without its optimizer's state "
                         "(save(..., optimizer_state=False)), which a sharded model trains "
                         "on; convert a model saved with that state")
    model = ShardedSlideClassifier(n_shards=n_shards, backend=backend, ray_address=ray_address,
                                   **single.get_params(deep=False))
    _, sparse = model._checked_params()
    hs = single.hidden_sizes_               # as fitted ("auto" resolved)
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
    model.rank_.memory = single.rank_.memory
    set_classes(model, single.classes_ if single.named_labels_ else None)
    set_target(model, fitted_on_1d(single))
    return model
