"""``slide generate`` (a synthetic XC data set) and ``slide plot`` (time to accuracy)."""
from __future__ import annotations

import os
import time

from slide import config as config_mod
from slide.cli.common import (BASELINE_DIR, CONFIG_FILE, EXIT_ERROR, EXIT_OK, EXIT_USAGE,
                              METRICS_FILE, PLOT_FILE, CliError, _info)
from slide.cli.rundir import member_dirs, read_metrics
from slide.config import ConfigError
from slide.fileio import atomic_write


# ---------------------------------------------------------------------------------------------
# generate, plot

def cmd_generate(args):
    from slide import synthetic
    overrides = {}
    problems = []
    for item in args.set or ():
        key, eq, text = item.partition("=")
        if not eq or not key.strip():
            problems.append(("--set", f"expected key=value, got {item!r}"))
            continue
        overrides[key.strip()] = config_mod.parse_value(text.strip())
    if args.preset not in synthetic.PRESETS:
        problems.append(("--preset", f"unknown preset {args.preset!r}; available: "
                                     f"{', '.join(sorted(synthetic.PRESETS))}"))
    elif not problems:
        try:
            synthetic.preset_params(args.preset, args.scale, **overrides)
        except ValueError as e:
            problems.append(("--set" if overrides else "--scale", str(e)))
    if args.seed < 0:
        problems.append(("--seed", f"must be >= 0, got {args.seed}"))
    if problems:
        raise ConfigError(problems)
    t0 = time.perf_counter()
    X_tr, Y_tr, X_te, Y_te = synthetic.generate(args.preset, args.scale, args.seed, **overrides)
    paths = synthetic.write_dataset(args.out, X_tr, Y_tr, X_te, Y_te)
    _info(f"{args.preset} (scale {args.scale:g}, seed {args.seed}): {X_tr.shape[0]:,} train + "
          f"{X_te.shape[0]:,} test points, {X_tr.shape[1]:,} features, {Y_tr.shape[1]:,} labels"
          f" ({time.perf_counter() - t0:.1f} s)")
    for p in paths:
        _info(f"  wrote {p}")
    return EXIT_OK


def _plot_series(run_dir):
    """``[(label, seconds, p1, after_fit)]`` for a run directory (and its dense baseline, if
    any): each network's curve, and (``after_fit``) the points of the model with the vote and
    re-ranker fitted after it."""
    series = []
    for sub, suffix in (("", ""), (BASELINE_DIR, " (dense baseline)")):
        d = os.path.join(run_dir, sub) if sub else run_dir
        path = os.path.join(d, METRICS_FILE)
        if not os.path.exists(path):
            if not sub:
                raise CliError(f"{run_dir}: no {METRICS_FILE} (is it a run directory?)",
                               EXIT_USAGE)
            continue
        recs = [r for r in read_metrics(path) if r.get("P@1") is not None]
        if not recs:
            if not sub:
                raise CliError(f"{path}: no evaluations logged yet", EXIT_USAGE)
            continue
        name = os.path.basename(os.path.normpath(run_dir)) + suffix
        if not sub:
            # name the main curve by its sampler (slide's LSH kinds, or a dense run)
            try:
                kind = config_mod.parse_toml_file(os.path.join(d, CONFIG_FILE))["sampler"]["kind"]
                name += " (dense)" if kind == "dense" else f" (slide, {kind} sampler)"
            except (ConfigError, KeyError, TypeError):
                pass
        if not sub and member_dirs(run_dir):
            # an ensemble's members, one after another on the clock, then the ensemble
            series.extend(_member_series(run_dir, name))
            series.append((name + ", ensemble", [r["train_seconds"] for r in recs],
                           [r["P@1"] for r in recs], True))
        else:
            series.extend(_network_series(recs, name))
    return series


def _network_series(recs, name, offset=0.0):
    """A network's curve; what fit builds after it (the neighbour vote and re-ranker) is its
    own point, at the network's seconds plus its own; every second shifted by ``offset``."""
    net = [r for r in recs if not r.get("neighbour_vote")]
    post = [r for r in recs if r.get("neighbour_vote")]
    series = [(name, [offset] + [offset + r["train_seconds"] for r in net],
               [None] + [r["P@1"] for r in net], False)]
    if post:
        series.append((name + " + vote, re-ranker", [offset + r["train_seconds"] for r in post],
                       [r["P@1"] for r in post], True))
    return series


def _member_series(run_dir, name):
    """The curves of an ensemble run's members, each starting where the one before ended."""
    series, offset = [], 0.0
    for d in member_dirs(run_dir):
        path = os.path.join(d, METRICS_FILE)
        recs = ([r for r in read_metrics(path) if r.get("P@1") is not None]
                if os.path.exists(path) else [])
        if recs:
            series.extend(_network_series(recs, f"{name}, {os.path.basename(d)}", offset))
            offset += recs[-1]["train_seconds"]
    return series


def cmd_plot(args):
    out = args.out or os.path.join(args.run_dirs[0], PLOT_FILE)
    n = write_time_to_accuracy(args.run_dirs, out)
    _info(f"wrote {out} ({n} curve{'s' if n != 1 else ''})")
    return EXIT_OK


def write_time_to_accuracy(run_dirs, out):
    """P@1 against training seconds of the runs in ``run_dirs`` (each with its dense baseline,
    if any) as a PNG at ``out``; returns the number of curves (networks)."""
    series = []
    for d in run_dirs:
        series.extend(_plot_series(d))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CliError("'slide plot' needs matplotlib, which is not installed: "
                       "pip install matplotlib", EXIT_ERROR) from None
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for name, xs, ys, after_fit in series:
        pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
        style = dict(marker="*", markersize=9, linestyle="none") if after_fit else \
            dict(marker="o", markersize=3)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name, **style)
    ax.set_xlabel("training wall time (s, kernel compilation excluded)")
    ax.set_ylabel("P@1 (evaluation sample)")
    ax.set_title("time to accuracy")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with atomic_write(out, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
    return sum(1 for *_, after_fit in series if not after_fit)
