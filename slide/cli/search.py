"""``slide train``'s ``[search]`` step: a ``SlideSearch`` over the table's values before the run,
its trials and winner in ``search.json``, the run then trained with the winner's values."""
from __future__ import annotations

import copy
import json
import math
import os
import warnings

from slide import config as config_mod
from slide import params
from slide.cli.common import SEARCH_FILE, _engine, _fmt_seconds, _info
from slide.fileio import write_text


def search_grid(cfg):
    """The ``[search]`` table as ``SlideSearch``'s ``param_grid`` (estimator keywords; {} for
    none)."""
    grid = {}
    for key, values in cfg.get("search", {}).items():
        name = params.BY_KEY[key].name
        grid[name] = [tuple(v) if name == "hidden_sizes" else v for v in values]
    return grid


def with_values(cfg, chosen):
    """A copy of ``cfg`` with the dotted keys of ``chosen`` set to their values (a search's
    winner)."""
    out = copy.deepcopy(cfg)
    for key, value in chosen.items():
        *tables, leaf = key.split(".")
        node = out
        for t in tables:
            node = node[t]
        node[leaf] = list(value) if isinstance(value, tuple) else value
    return out


def run_search(cfg, run_dir, X_tr, Y_tr, resume):
    """The ``[search]`` step: a ``SlideSearch`` over the table's values on the training rows
    (its trials fused, scored on held-out rows, halved until one is left), its trials and
    winner written to ``search.json``; returns the configuration with the winner's values,
    which the run then trains. A resumed run reads the winner back instead of searching
    again."""
    path = os.path.join(run_dir, SEARCH_FILE)
    if resume and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            chosen = json.load(f)["best"]
        _info(f"search: the winner of {SEARCH_FILE}: {_fmt_chosen(chosen)}")
        return with_values(cfg, chosen)
    from sklearn.exceptions import FitFailedWarning

    from slide.search import SlideSearch
    est = _engine()
    grid = search_grid(cfg)
    keys = {_params_key(name, cfg): name for name in grid}
    search = SlideSearch(est.SlideClassifier(**config_mod.estimator_kwargs(cfg)), grid,
                         refit=False)
    n_trials = math.prod(len(v) for v in grid.values())
    _info(f"search: {n_trials} trials of {', '.join(keys)} (fused where their shapes agree)")
    with warnings.catch_warnings():
        # a diverged trial: the lines below name it
        warnings.simplefilter("ignore", FitFailedWarning)
        search.fit(X_tr, Y_tr)
    res = search.cv_results_
    trials = []
    for i, p in enumerate(res["params"]):
        score = float(res["mean_test_score"][i])
        diverged = math.isnan(score)
        trials.append({"values": {k: _plain(p[n]) for k, n in keys.items()},
                       "held_out_P@5": None if diverged else score,
                       "batches": int(res["n_batches"][i]),
                       "rank": int(res["rank_test_score"][i]),
                       "pass_seconds": round(float(res["mean_fit_time"][i]), 3)})
        what = "diverged" if diverged else f"held-out P@5 {score:.4f}"
        _info(f"  {_fmt_chosen(trials[-1]['values'])}: {what} after {trials[-1]['batches']} "
              f"batches")
    chosen = trials[search.best_index_]["values"]
    write_text(path, json.dumps({"held_out_rows": search.n_held_out_,
                                 "seconds": round(search.train_seconds_, 3),
                                 "trials": trials, "best": chosen}, indent=2) + "\n")
    _info(f"search: {_fmt_chosen(chosen)} wins in {_fmt_seconds(search.train_seconds_)}; "
          f"training it")
    return with_values(cfg, chosen)


def _params_key(name, cfg):
    """The config key of the estimator keyword ``name`` among the ``[search]`` table's."""
    return next(k for k in cfg["search"] if params.BY_KEY[k].name == name)


def _plain(v):
    return list(v) if isinstance(v, tuple) else v


def _fmt_chosen(values):
    return ", ".join(f"{k}={v}" for k, v in values.items())
