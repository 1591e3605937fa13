"""``slide train`` with ``model.n_models`` = N >= 2: ``SlideEnsemble(n_models=N)``'s members
trained one after another, as ``SlideEnsemble.fit`` trains them, each a phase of its own.

Member k is the run's configuration with ``train.seed`` = ``member_seed(train.seed, k)``; it
trains into ``RUN_DIR/member-k/`` (checkpoints, ``metrics.jsonl``, ``model.slide``: a
single-model run directory of its own) and resumes on its own, so a run stopped in member 2
keeps members 0 and 1 as they finished. The members are then put together
(``SlideEnsemble.from_members``), evaluated on the run's evaluation sample (one line in the
run's ``metrics.jsonl``) and saved as the run's ``model.slide``, which ``slide evaluate`` and
``slide predict`` read like any model file; it holds no optimizer state (the members' own
checkpoints hold theirs), so it predicts and does not train on.
"""
from __future__ import annotations

import copy
import json
import os
import time

from slide import config as config_mod
from slide.cli.common import (KS, MEMBER_DIR, METRICS_FILE, MODEL_FILE, _has_neighbour_memory,
                              _info)
from slide.fileio import write_text


def member_config(cfg, k):
    """Member k's configuration: the run's, seeded as ``SlideEnsemble`` seeds its member k."""
    from slide.ensemble import member_seed
    out = copy.deepcopy(cfg)
    out["train"]["seed"] = member_seed(cfg["train"]["seed"], k)
    return out


def train_ensemble(cfg, run_dir, data, run_phase, text):
    """Train (or resume) every member, then build, evaluate and save the ensemble. Returns
    ``(results, ensemble)``: each member's phase result under ``"member-k"``, and the
    ensemble's (members, batches, training seconds, P@k on the evaluation sample).
    ``run_phase(cfg, phase_dir, phase, label, last)`` trains one phase (``slide.cli.train``)
    and returns ``(model, result)``; ``last``: whether it is the ensemble's last."""
    from slide.ensemble import SlideEnsemble
    n = cfg["model"]["n_models"]
    results, members = {}, []
    for k in range(n):
        phase = MEMBER_DIR.format(k)
        model, results[phase] = run_phase(member_config(cfg, k), os.path.join(run_dir, phase),
                                          phase, f"member {k}", k == n - 1)
        members.append(model)
    ensemble = SlideEnsemble.from_members(members, cfg["train"]["seed"])
    return results, _finish(ensemble, cfg, run_dir, data, results, text)


def _finish(ensemble, cfg, run_dir, data, results, text):
    """Evaluate the ensemble on the evaluation sample (a line of the run's metrics log) and
    write it as the run's model file; its summary entry."""
    from slide.cli.infer import _scores
    from slide.cli.textdata import save_final
    _, _, X_eval, Y_eval = data
    t0 = time.perf_counter()
    scores = _scores(ensemble, X_eval, Y_eval, exact=True)
    eval_seconds = time.perf_counter() - t0
    member_results = list(results.values())
    record = {"batch": sum(r["batches"] for r in member_results),
              "samples": sum(r["samples"] for r in member_results),
              "train_seconds": round(ensemble.train_seconds_, 4),
              **{f"P@{k}": round(float(scores[f"P@{k}"]), 6) for k in KS},
              "eval_seconds": round(eval_seconds, 3), "members": len(member_results),
              # as in a member's log: whether the predictions had the neighbour vote in them
              "neighbour_vote": _has_neighbour_memory(ensemble.members_[0])}
    # its one line (a resumed run's ensemble is evaluated afresh)
    write_text(os.path.join(run_dir, METRICS_FILE), json.dumps(record) + "\n")
    path = os.path.join(run_dir, MODEL_FILE)
    # without the members' optimizer state: their own checkpoints hold it for a resume, and
    # this file is for predicting (so their moments are not on disk twice)
    save_final(ensemble, path, text, {"config": config_mod.strip_private(cfg),
                                      "phase": "ensemble"}, optimizer_state=False)
    _info(f"[ensemble] {len(member_results)} members: P@1 {record['P@1']:.4f} on the "
          f"evaluation sample; saved to {path}")
    return {"members": len(member_results), "batches": record["batch"],
            "train_seconds": round(ensemble.train_seconds_, 3),
            **{f"P@{k}": record[f"P@{k}"] for k in KS}}
