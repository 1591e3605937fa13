"""Accuracy per second of slide's levers against the label trees, one lever at a time.

Every run is a fresh ``SlideClassifier`` (kernels compiled before its clock by ``fit``'s warm-up,
so ``train_seconds_`` excludes compilation) built from a base configuration plus one change;
at every epoch end (and ``--evals-per-epoch`` times within an epoch) it is scored on a fixed
shuffled sample of the test set (P@1, P@5, PSP@5: the curve), and at the end on every test
point. The label trees (Omikuji, Parabel-like; napkinXC's PLT) train on the same split with the
same number of threads, in the same invocation, for reference; ``--tree-runs N`` fits each N
times, so that their rows carry a standard deviation as slide's seeds do (Omikuji takes no seed
and its fits differ: ``bench/results/accuracy_defaults_amd.md``, "Omikuji fitted three times").

Records are appended to ``OUT.jsonl`` (so several invocations on one data set accumulate); the
table ``OUT.md`` and the plot ``OUT.png`` (test-sample P@1 against cumulative training seconds)
are rewritten from all records of the file each time.

Examples::

    python bench/accuracy.py --train T --test T --name debtags --trees omikuji,napkinxc \\
        --base '{"learning_rate": 1e-3}' --lever learning_rate=1e-4,1e-3,1e-2 \\
        --lever hidden_sizes=[256],[512] --run '{"epochs": 3, "lr_schedule": "cosine"}'
    python bench/accuracy.py --preset tiny --name tiny --defaults --out /tmp/acc

``--lever KEY=V1,V2`` expands to one run per value (values are JSON; ``normalize`` is the
bench's own key: ``"l2"`` L2-normalises every input row before training and testing).
``--defaults`` adds a run of ``SlideClassifier()`` with no hyperparameter but threads and seed.
A run with ``"n_models": K`` trains a ``SlideEnsemble`` of K members (seeded from the run's
seed; one after another, or fused with ``"fused": true``, as ``SlideEnsemble``'s ``fused``
says); its curve is its final score on the test sample.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

# run keys that are the bench's, not the estimator's: "normalize" (see below), "n_models"
# (a slide.ensemble.SlideEnsemble of that many members, each built from the run's other keys)
# and "fused" (the ensemble's); "search" (a slide.SlideSearch of that param_grid over the run's
# other keys) and "factor" (the search's successive halving: null trains every trial to the end)
BENCH_KEYS = ("normalize", "n_models", "fused", "search", "factor")


# ------------------------------------------------------------------------------------------------
# data

def load_split(args):
    """(X_train, Y_train, X_test, Y_test, train_path or None) in slide's canonical CSR form."""
    if args.preset:
        from slide.synthetic import generate
        Xtr, Ytr, Xte, Yte = generate(args.preset, scale=args.scale, seed=args.data_seed)
        return Xtr, Ytr, Xte, Yte, None
    from slide.data import read_xc
    Xtr, Ytr = read_xc(args.train)
    Xte, Yte = read_xc(args.test)
    if Xte.shape[1] != Xtr.shape[1] or Yte.shape[1] != Ytr.shape[1]:
        raise ValueError(f"--test {args.test} has shape {Xte.shape[1]} features / "
                         f"{Yte.shape[1]} labels, --train {Xtr.shape[1]} / {Ytr.shape[1]}")
    return Xtr, Ytr, Xte, Yte, args.train


def l2_normalise(X):
    """Rows scaled to unit L2 norm (empty rows unchanged)."""
    X = X.copy()
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    norms[norms == 0] = 1.0
    X.data /= np.repeat(norms, np.diff(X.indptr)).astype(np.float32)
    return X


def measured_commit():
    """The commit these runs measure (``bench.common.git_commit``: ``+dirty`` when code differs
    from it)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:
        sys.path.insert(0, root)
    from bench.common import git_commit
    return git_commit()


def row_norm_summary(X):
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    return {"mean": float(norms.mean()), "min": float(norms.min()), "max": float(norms.max())}


# ------------------------------------------------------------------------------------------------
# scoring

def score_topk(Y, topk, inv_prop):
    from slide import metrics
    m = metrics.evaluate(Y, topk, ks=(1, 5), inv_propensity=inv_prop)
    return {"P@1": m["P@1"], "P@5": m["P@5"], "PSP@5": m["PSP@5"]}


def pad_topk(rows, k):
    """List of label lists -> (n, k) int64, short rows padded with -1 (never a hit)."""
    out = np.full((len(rows), k), -1, np.int64)
    for i, r in enumerate(rows):
        r = list(r)[:k]
        out[i, :len(r)] = r
    return out


# ------------------------------------------------------------------------------------------------
# slide runs

def run_slide(name, params, seed, data, args):
    """Train one fresh SlideClassifier; returns its record (curve, final metrics, seconds)."""
    from slide import SlideClassifier
    Xtr, Ytr, Xte, Yte, sample, inv_prop = data
    params = dict(params)
    normalize = params.pop("normalize", None)
    if normalize == "l2":
        Xtr, Xte = l2_normalise(Xtr), l2_normalise(Xte)
    elif normalize is not None:
        raise ValueError(f"normalize must be 'l2' or absent, got {normalize!r}")
    n_models = params.pop("n_models", None)
    fused = params.pop("fused", None)
    grid = params.pop("search", None)
    search_kw = {"factor": params.pop("factor")} if "factor" in params else {}
    if grid is not None:
        return run_search(name, params, grid, seed, (Xtr, Ytr, Xte, Yte, sample, inv_prop),
                          args, normalize, **search_kw)
    if n_models is not None:
        split = (Xtr, Ytr, Xte, Yte, sample, inv_prop)
        return run_ensemble(name, params, n_models, seed, split, args, normalize, fused)
    model = SlideClassifier(**params, n_threads=args.threads, random_state=seed)
    n_batches = -(-Xtr.shape[0] // int(model.batch_size))
    marks = {int(round(n_batches * (j + 1) / args.evals_per_epoch)) - 1
             for j in range(args.evals_per_epoch)}
    curve = []

    def on_batch(m, info):
        # with several batches in flight the callback comes once a wave of info["batches"]
        last = info["batch_in_epoch"]
        if any(last - info.get("batches", 1) < mark <= last for mark in marks):
            top = m.predict_topk(Xte[sample], k=5)
            rec = score_topk(Yte[sample], top, inv_prop)
            rec.update(epoch=info["epoch"] + (info["batch_in_epoch"] + 1) / n_batches,
                       seconds=m.train_seconds_)
            curve.append(rec)
            if args.verbose:
                print(f"  {name} seed {seed} epoch {rec['epoch']:.2f} "
                      f"{rec['seconds']:.1f}s P@1 {rec['P@1']:.4f}", flush=True)
        return m.train_seconds_ > args.max_seconds

    t0 = time.perf_counter()
    model.fit(Xtr, Ytr, callback=on_batch)
    wall = time.perf_counter() - t0
    t0 = time.perf_counter()
    top = model.predict_topk(Xte, k=5)
    predict_s = time.perf_counter() - t0
    final = score_topk(Yte, top, inv_prop)
    return {"system": "slide", "run": name, "params": params, "normalize": normalize,
            "seed": seed, "train_seconds": model.train_seconds_, "predict_seconds": predict_s,
            "compile_seconds": model.compile_seconds_, "fit_wall_seconds": wall,
            "stopped_early": bool(model.stopped_ or model.budget_spent_), "batches": model.batches_,
            "curve": curve, "final": final}


def run_ensemble(name, params, n_models, seed, data, args, normalize, fused=None):
    """Train one SlideEnsemble of ``n_models`` members built from ``params`` (``fused``: its
    flag, None for its default); its record."""
    from slide import SlideClassifier
    from slide.ensemble import SlideEnsemble
    Xtr, Ytr, Xte, Yte, sample, inv_prop = data
    model = SlideEnsemble(SlideClassifier(**params, n_threads=args.threads), n_models=n_models,
                          random_state=seed,
                          **({} if fused is None else {"fused": bool(fused)}))
    t0 = time.perf_counter()
    model.fit(Xtr, Ytr, callback=lambda m, info: m.train_seconds_ > args.max_seconds)
    wall = time.perf_counter() - t0
    first = model.members_[0]
    point = score_topk(Yte[sample], model.predict_topk(Xte[sample], k=5), inv_prop)
    n_batches = -(-Xtr.shape[0] // int(first.batch_size))
    point.update(epoch=first.epoch_ + first.batch_in_epoch_ / n_batches,
                 seconds=model.train_seconds_)
    if args.verbose:
        print(f"  {name} seed {seed} {model.train_seconds_:.1f}s P@1 {point['P@1']:.4f}",
              flush=True)
    t0 = time.perf_counter()
    top = model.predict_topk(Xte, k=5)
    predict_s = time.perf_counter() - t0
    final = score_topk(Yte, top, inv_prop)
    return {"system": "slide", "run": name,
            "params": dict(params, n_models=n_models, fused=bool(model.fused)),
            "normalize": normalize, "seed": seed, "train_seconds": model.train_seconds_,
            "predict_seconds": predict_s,
            "compile_seconds": model.compile_seconds_, "fit_wall_seconds": wall,
            "stopped_early": any(bool(m.stopped_ or m.budget_spent_) for m in model.members_),
            "batches": sum(m.batches_ for m in model.members_), "curve": [point],
            "final": final}


def run_search(name, params, grid, seed, data, args, normalize, **search_kw):
    """Fit one SlideSearch of ``grid`` over ``params`` (``search_kw``: the search's own
    settings); the record of its winner (its test metrics, the search's seconds, every trial's
    held-out P@5 when last scored, the batches it had trained then and its rank)."""
    from slide import SlideClassifier, SlideSearch
    Xtr, Ytr, Xte, Yte, sample, inv_prop = data
    search = SlideSearch(SlideClassifier(**params, n_threads=args.threads, random_state=seed),
                         grid, **search_kw)
    t0 = time.perf_counter()
    search.fit(Xtr, Ytr)
    wall = time.perf_counter() - t0
    t0 = time.perf_counter()
    top = search.predict_topk(Xte, k=5)
    predict_s = time.perf_counter() - t0
    final = score_topk(Yte, top, inv_prop)
    res = search.cv_results_
    trials = [{"params": p, "held_out_P@5": float(sc), "batches": int(b), "rank": int(r)}
              for p, sc, b, r in zip(res["params"], res["mean_test_score"], res["n_batches"],
                                     res["rank_test_score"])]
    if args.verbose:
        print(f"  {name} seed {seed} {search.train_seconds_:.1f}s best {search.best_params_}",
              flush=True)
    return {"system": "slide", "run": name, "params": dict(params, search=grid, **search_kw),
            "normalize": normalize, "seed": seed, "train_seconds": search.train_seconds_,
            "predict_seconds": predict_s, "compile_seconds": search.compile_seconds_,
            "fit_wall_seconds": wall, "stopped_early": False,
            "best_params": search.best_params_, "trials": trials,
            "curve": [dict(final, epoch=float(search.best_estimator_.epoch_),
                           seconds=search.train_seconds_)],
            "final": final}


# ------------------------------------------------------------------------------------------------
# label trees

def run_omikuji(data, train_path, args, run=0):
    """One Omikuji fit (it takes no seed, and its trees differ from fit to fit: ``run`` is the
    fit's index in the invocation) and its record."""
    import omikuji
    Xtr, Ytr, Xte, Yte, _, inv_prop = data
    tmp = None
    if train_path is None:      # a generated set: omikuji reads XC files only
        from slide.data import write_xc
        tmp = os.path.join(args.work_dir, "omikuji_train.txt")
        write_xc(tmp, Xtr, Ytr)
        train_path = tmp
    hp = omikuji.Model.default_hyper_param()
    t0 = time.perf_counter()
    model = omikuji.Model.train_on_data(train_path, hp, n_threads=args.threads)
    seconds = time.perf_counter() - t0
    rows = []
    t0 = time.perf_counter()
    for i in range(Xte.shape[0]):
        a, b = Xte.indptr[i], Xte.indptr[i + 1]
        pairs = list(zip(Xte.indices[a:b].tolist(), Xte.data[a:b].tolist()))
        rows.append([lab for lab, _ in model.predict(pairs, top_k=5)])
    predict_s = time.perf_counter() - t0
    final = score_topk(Yte, pad_topk(rows, 5), inv_prop)
    return {"system": "omikuji", "run": "omikuji (defaults)", "params": {}, "seed": run,
            "train_seconds": seconds, "predict_seconds": predict_s, "note": "seconds include reading the XC file",
            "curve": [dict(final, epoch=1.0, seconds=seconds)], "final": final}


def run_napkinxc(data, args, run=0):
    """One napkinXC PLT fit seeded ``run`` and its record."""
    from napkinxc.models import PLT
    Xtr, Ytr, Xte, Yte, _, inv_prop = data
    labels = [Ytr.indices[Ytr.indptr[i]:Ytr.indptr[i + 1]].tolist() for i in range(Ytr.shape[0])]
    model = PLT(os.path.join(args.work_dir, "napkinxc_plt"), threads=args.threads, seed=run)
    t0 = time.perf_counter()
    model.fit(Xtr, labels)
    seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    pred = model.predict(Xte, top_k=5)
    predict_s = time.perf_counter() - t0
    final = score_topk(Yte, pad_topk([[p[0] if isinstance(p, tuple) else p for p in r]
                                      for r in pred], 5), inv_prop)
    return {"system": "napkinxc", "run": "napkinXC PLT (defaults)", "params": {}, "seed": run,
            "train_seconds": seconds, "predict_seconds": predict_s, "curve": [dict(final, epoch=1.0, seconds=seconds)],
            "final": final}


# ------------------------------------------------------------------------------------------------
# the runs of one invocation

def expand_runs(args):
    """[(name, params)]: the base, one run per lever value, the explicit runs, the defaults."""
    base = json.loads(args.base) if args.base else {}
    runs = []
    if not args.no_base:
        runs.append(("base", dict(base)))
    for lever in args.lever:
        key, _, values = lever.partition("=")
        if not values:
            raise ValueError(f"--lever {lever!r}: expected KEY=V1,V2,...")
        for v in json.loads(f"[{values}]"):
            runs.append((f"{key}={json.dumps(v)}", dict(base, **{key: v})))
    for r in args.run:
        change = json.loads(r)
        runs.append((" ".join(f"{k}={json.dumps(v)}" for k, v in change.items()),
                     dict(base, **change)))
    if args.defaults:
        runs.append(("SlideClassifier()", {}))
    return runs


def read_records(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def append_record(path, rec):
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


# ------------------------------------------------------------------------------------------------
# report

def summarise(records):
    """Group by (data set, system, run, invocation): mean and std over seeds of the final
    metrics and seconds, in first-seen order."""
    groups = {}
    for r in records:
        # the same change on different bases is a different run; and seconds from different
        # invocations (a different load on the machine) are never averaged together
        config = json.dumps(dict(r.get("params", {}), normalize=r.get("normalize")),
                            sort_keys=True)
        key = (r["dataset"], r["system"], r["run"], config, r.get("time"))
        groups.setdefault(key, []).append(r)
    rows = []
    for (ds, system, run, _, _), recs in groups.items():
        row = {"dataset": ds, "system": system, "run": run, "seeds": len(recs),
               "config": config_text(recs[0])}
        for key in ("P@1", "P@5", "PSP@5"):
            vals = np.array([r["final"][key] for r in recs])
            row[key] = (float(vals.mean()), float(vals.std(ddof=1)) if len(vals) > 1 else None)
        secs = np.array([r["train_seconds"] for r in recs])
        row["seconds"] = float(secs.mean())
        when = time.strftime("%Y-%m-%d", time.gmtime(recs[0]["time"])) if "time" in recs[0] \
            else ""
        row["measured"] = when + (f" `{recs[0]['commit']}`" if recs[0].get("commit") else "")
        pred = [r["predict_seconds"] for r in recs if "predict_seconds" in r]
        row["predict_seconds"] = float(np.mean(pred)) if pred else None
        row["epochs"] = recs[0]["curve"][-1]["epoch"] if recs[0]["curve"] else None
        rows.append(row)
    return rows


def config_text(rec):
    """The run's hyperparameters beyond the defaults, compactly (``"defaults"`` if none)."""
    items = dict(rec.get("params", {}))
    if rec.get("normalize"):
        items["normalize"] = rec["normalize"]
    if rec["system"] != "slide":
        return "library defaults"
    return " ".join(f"{k}={json.dumps(v)}" for k, v in items.items()) or "defaults"


def _fmt(mean_std):
    mean, std = mean_std
    return f"{mean:.4f}" if std is None else f"{mean:.4f} ± {std:.4f}"


def write_markdown(path, records, title, summary=None):
    """The report: title, the text of ``summary`` (a Markdown file) if given, then one table
    per data set."""
    rows = summarise(records)
    lines = [f"# {title}", "",
             "<!-- generated by bench/accuracy.py from the .jsonl beside it -->", ""]
    if summary:
        with open(summary) as f:
            lines += [f.read().rstrip(), ""]
    lines += [
             "Final metrics on every test point; seconds = training only (slide: "
             "`train_seconds_`, kernels compiled before the clock; Omikuji: `train_on_data`, "
             "which includes reading the file; napkinXC: `fit`). ± = std over seeds.", ""]
    for ds in dict.fromkeys(r["dataset"] for r in rows):
        lines += [f"## {ds}", "", "| measured | system | run | hyperparameters | seeds | epochs | "
                  "train s | predict s (test set) | P@1 | P@5 | PSP@5 |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if r["dataset"] != ds:
                continue
            ep = "" if r["epochs"] is None or r["system"] != "slide" else f"{r['epochs']:.2f}"
            ps = "" if r["predict_seconds"] is None else f"{r['predict_seconds']:.1f}"
            lines.append(f"| {r['measured']} | {r['system']} | {r['run']} | {r['config']} | "
                         f"{r['seeds']} | {ep} | "
                         f"{r['seconds']:.1f} | {ps} | {_fmt(r['P@1'])} | {_fmt(r['P@5'])} | "
                         f"{_fmt(r['PSP@5'])} |")
        lines.append("")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def write_plot(path, records):
    """P@1 on the test sample against training seconds, one panel per data set (skipped
    without matplotlib)."""
    try:
        import matplotlib
    except ImportError:     # pragma: no cover - matplotlib is optional for the bench
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    datasets = list(dict.fromkeys(r["dataset"] for r in records))
    fig, axes = plt.subplots(1, len(datasets), figsize=(7 * len(datasets), 5), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        for r in records:
            if r["dataset"] != ds or r.get("seed", 0) != min(
                    q.get("seed", 0) for q in records
                    if q["dataset"] == ds and q["run"] == r["run"]):
                continue
            xs = [p["seconds"] for p in r["curve"]]
            ys = [p["P@1"] for p in r["curve"]]
            if r["system"] == "slide":
                ax.plot(xs, ys, marker=".", label=r["run"])
            else:
                ax.scatter(xs, ys, marker="*", s=150, zorder=5, label=r["run"])
        ax.set_xlabel("training seconds")
        ax.set_ylabel("P@1 (test sample)")
        ax.set_title(ds)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train")
    ap.add_argument("--test")
    ap.add_argument("--preset", help="synthetic preset instead of --train/--test")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--data-seed", type=int, default=0)
    ap.add_argument("--name", required=True, help="data set name in the report")
    ap.add_argument("--base", help="JSON object: hyperparameters shared by every run")
    ap.add_argument("--no-base", action="store_true", help="no run of the base alone")
    ap.add_argument("--lever", action="append", default=[], help="KEY=V1,V2 (JSON values)")
    ap.add_argument("--run", action="append", default=[], help="JSON object of changes")
    ap.add_argument("--defaults", action="store_true", help="also SlideClassifier()")
    ap.add_argument("--trees", default="", help="comma list: omikuji, napkinxc")
    ap.add_argument("--tree-runs", type=int, default=1,
                    help="fits of each tree (Omikuji's differ from fit to fit; napkinXC's are "
                         "seeded 0, 1, ...): their mean and std in the report")
    ap.add_argument("--seeds", default="0", help="comma list of seeds for every slide run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-points", type=int, default=3000)
    ap.add_argument("--evals-per-epoch", type=int, default=1)
    ap.add_argument("--max-seconds", type=float, default=240.0,
                    help="stop a slide run after this many training seconds")
    ap.add_argument("--out", default="bench/results/accuracy",
                    help="path prefix of .jsonl/.md/.png")
    ap.add_argument("--title", default="Accuracy per second: slide's levers against label trees")
    ap.add_argument("--summary", help="Markdown file whose text opens the report")
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite .md/.png from the .jsonl without running anything")
    ap.add_argument("--work-dir", default=None)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    if not args.report_only and not args.preset and not (args.train and args.test):
        ap.error("give --train and --test, or --preset")
    if args.evals_per_epoch < 1:
        ap.error("--evals-per-epoch must be >= 1")
    return args


def main(argv=None):
    import tempfile
    from slide import metrics
    args = parse_args(argv)
    if args.report_only:
        records = read_records(args.out + ".jsonl")
        write_markdown(args.out + ".md", records, args.title, args.summary)
        write_plot(args.out + ".png", records)
        return records
    args.work_dir = args.work_dir or tempfile.mkdtemp(prefix="slide_acc_")
    Xtr, Ytr, Xte, Yte, train_path = load_split(args)
    rng = np.random.default_rng(12345)
    sample = np.sort(rng.permutation(Xte.shape[0])[:args.eval_points])
    inv_prop = metrics.inverse_propensity(Ytr)
    data = (Xtr, Ytr, Xte, Yte, sample, inv_prop)
    stamp = {"dataset": args.name, "threads": args.threads, "time": time.time(),
             "commit": measured_commit(), "row_norms": row_norm_summary(Xtr)}
    jsonl = args.out + ".jsonl"
    os.makedirs(os.path.dirname(os.path.abspath(jsonl)), exist_ok=True)
    for tree in [t for t in args.trees.split(",") if t]:
        if tree not in ("omikuji", "napkinxc"):
            raise ValueError(f"--trees: unknown {tree!r} (omikuji, napkinxc)")
        for run in range(args.tree_runs):
            rec = run_omikuji(data, train_path, args, run) if tree == "omikuji" else \
                run_napkinxc(data, args, run)
            append_record(jsonl, dict(stamp, **rec))
            print(f"{args.name} {rec['run']} run {run}: {rec['train_seconds']:.1f}s "
                  f"{rec['final']}", flush=True)
    for name, params in expand_runs(args):
        for seed in [int(s) for s in args.seeds.split(",")]:
            rec = run_slide(name, params, seed, data, args)
            append_record(jsonl, dict(stamp, **rec))
            print(f"{args.name} {name} seed {seed}: {rec['train_seconds']:.1f}s "
                  f"(compile {rec['compile_seconds']:.1f}s) {rec['final']}", flush=True)
    records = read_records(jsonl)
    write_markdown(args.out + ".md", records, args.title, args.summary)
    write_plot(args.out + ".png", records)
    return records


if __name__ == "__main__":
    main(sys.argv[1:])
