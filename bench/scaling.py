"""Cost growth of slide and the dense baselines: number of labels and number of threads.

    python bench/scaling.py --out bench/results

Label sweep: the ``xc200k`` shape (100k features, ~90 nonzeros and ~4 labels per point) with
the number of labels set to each of ``--labels`` (default 10k, 50k, 200k, 670,091). Thread
sweep: at ``--thread-labels`` labels, 1 .. all cores. Every point is one system in its own
subprocess training **one whole epoch** of ``--epoch-points`` points (default 20,000: 157
batches of 128), timed as the comparisons time it: slide's first table build, every rehash and
rebuild, the dense baselines' every step; only compilation and graph tracing (a throw-away
warm-up fit) and evaluation are outside the clock. The points are fewer than a real epoch's so
that the dense baselines' epochs at 670k labels fit in minutes.

Writes ``scaling.json``, ``scaling.md`` and ``scaling.png`` into ``--out``; prints the table last.
"""
from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common  # noqa: E402
from bench.worker import source_digest  # noqa: E402


def _sha(raw):
    import hashlib
    return hashlib.sha1(raw.encode()).hexdigest()[:16]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--preset", default="xc200k", help="shape whose label count is swept")
    p.add_argument("--labels", default="10000,50000,200000,670091",
                   help="comma list of label counts")
    p.add_argument("--threads-list", default=None,
                   help="comma list of thread counts (default 1..all cores)")
    p.add_argument("--thread-labels", type=int, default=200_000,
                   help="label count of the thread sweep (must be in --labels)")
    p.add_argument("--systems", default="slide,tf,torch")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--init", default="glorot_normal+log_prior")
    p.add_argument("--epoch-points", type=int, default=20_000,
                   help="training points: every point of the sweep trains one whole epoch of them")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slide-param", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", default="bench/results")
    p.add_argument("--repeat", type=int, default=1,
                   help="measure each point N times and keep the fastest")
    p.add_argument("--reuse", action="store_true",
                   help="reuse cached baseline points measured with identical data and settings")
    p.add_argument("--cache-dir", default=str(common.DEFAULT_CACHE))
    p.add_argument("--lock", default=None, help="run each system's process under "
                   "'flock LOCK' (e.g. /tmp/slide-bench.lock) to serialise with other heavy runs")
    a = p.parse_args(argv)
    a.labels = [int(x) for x in a.labels.split(",") if x.strip()]
    cores = common.machine_description()["cores"]
    a.threads_list = ([int(x) for x in a.threads_list.split(",")] if a.threads_list
                      else list(range(1, cores + 1)))
    a.systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    if a.thread_labels not in a.labels:
        p.error("--thread-labels must be one of --labels")
    import ast
    a.slide_params = {}
    for kv in a.slide_param:
        k, _, v = kv.partition("=")
        try:
            a.slide_params[k.strip()] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            a.slide_params[k.strip()] = v
    return a


def loglog_slope(xs, ys):
    """Least-squares exponent b of y ~ x^b (1 = linear growth)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x and y]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx if sxx else None


def measure(a, meta, system, threads, work):
    """One point of the sweep: a fresh subprocess trains ``system`` for one whole epoch at
    (labels, threads). With ``--reuse`` a baseline's point comes from the cache when data and
    settings match."""
    spec = {"system": system, "meta": meta, "threads": threads, "hidden": a.hidden, "lr": a.lr,
            "init": a.init, "seed": a.seed, "batch_size": a.batch_size, "epochs": 1,
            "n_eval": 0, "final_eval": False, "max_batches": None, "warmup": True,
            "slide_params": a.slide_params if system.startswith("slide") else None,
            "tag": f"{system}-L{meta['n_labels']}-T{threads}"}
    cp = None
    if system in common.BASELINES:
        keep = {k: v for k, v in spec.items() if k not in ("meta", "slide_params", "tag")}
        src = source_digest(system)
        raw = json.dumps([meta["key"], keep, src], sort_keys=True)
        cp = Path(a.cache_dir) / "scaling" / f"{spec['tag']}-{_sha(raw)}.json"
    if a.reuse and cp is not None and cp.exists():
        r = json.loads(cp.read_text())
        source = f"reused: {r['finished_at']}, commit {r['commit']}"
        print(f"[{spec['tag']}] {source}")
    else:
        r = common.run_in_subprocess(spec, work, lock=a.lock)
        source = f"this run ({r['finished_at']})"
        if cp is not None:
            cp.parent.mkdir(parents=True, exist_ok=True)
            cp.write_text(json.dumps(r))
    n = r["n_batches"]
    if n != r["batches_per_epoch"]:
        raise RuntimeError(f"[{spec['tag']}] trained {n} batches, not the epoch's "
                           f"{r['batches_per_epoch']}")
    epoch = r["train_seconds"]
    return {"system": system, "n_labels": meta["n_labels"], "threads": threads,
            "batches": n, "epoch_seconds": epoch, "seconds_per_batch": epoch / n,
            "seconds_per_1k_samples": epoch * 1000 / r["samples"],
            "first_batch_seconds": r["batch_end_seconds"][0] if n else None,
            "peak_rss_bytes": r["peak_rss_bytes"], "active_mean": r.get("active_mean"),
            "rehashes": r.get("rehashes"), "rebuilds": r.get("rebuilds"), "source": source,
            "cpu_utilisation": r.get("cpu_utilisation")}


def plot(rows, a, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[plot] matplotlib is not installed (bench extra); no PNG written")
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    T = max(a.threads_list)
    for s in a.systems:
        pts = sorted((r["n_labels"], r["epoch_seconds"]) for r in rows
                     if r["system"] == s and r["threads"] == T)
        if pts:
            ax1.plot(*zip(*pts), marker="o", label=common.LABELS.get(s, s))
        pts = sorted((r["threads"], r["epoch_seconds"]) for r in rows
                     if r["system"] == s and r["n_labels"] == a.thread_labels)
        if pts:
            ax2.plot(*zip(*pts), marker="o", label=common.LABELS.get(s, s))
    # a line proportional to the number of labels through the first dense point, for reference
    dense = sorted((r["n_labels"], r["epoch_seconds"]) for r in rows
                   if r["system"] == "tf" and r["threads"] == T)
    if dense:
        x0, y0 = dense[0]
        xs = sorted(a.labels)
        ax1.plot(xs, [y0 * x / x0 for x in xs], ls=":", c="grey", label="∝ labels")
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    ax1.set_xlabel("number of labels")
    ax1.set_ylabel("seconds per epoch (measured whole)")
    ax1.set_title(f"{T} threads, {a.epoch_points:,}-point epoch", fontsize=9)
    ax2.set_yscale("log")
    from matplotlib.ticker import NullFormatter
    for ax in (ax1, ax2):
        ax.yaxis.set_minor_formatter(NullFormatter())  # minor labels overlap on short spans
    ax2.set_xlabel("threads")
    ax2.set_ylabel("seconds per epoch (measured whole)")
    ax2.set_xticks(a.threads_list)
    ax2.set_title(f"{a.thread_labels:,} labels", fontsize=9)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv=None):
    a = parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python bench/scaling.py " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:]))
    work = Path(a.cache_dir) / "runs" / ("scaling-" + time.strftime("%Y%m%d-%H%M%S"))
    n_points = a.epoch_points
    rows = []
    T = max(a.threads_list)
    for n_labels in a.labels:
        meta = common.prepare_data(a.preset, 1.0, n_points, 64, a.seed, a.cache_dir,
                                   overrides={"n_labels": n_labels})
        threads = a.threads_list if n_labels == a.thread_labels else [T]
        for system in a.systems:
            for t in threads:
                # --repeat N: the fastest of N measurements (interference from other processes
                # on a shared machine only ever adds time); every repeat is kept in the JSON
                reps = [measure(a, meta, system, t, work) for _ in range(a.repeat)]
                best = min(reps, key=lambda r: r["epoch_seconds"])
                best = dict(best, repeats=[{k: r[k] for k in ("epoch_seconds",
                                                               "cpu_utilisation", "source")}
                                           for r in reps])
                rows.append(best)
    by = {(r["system"], r["n_labels"], r["threads"]): r for r in rows}
    slopes = {s: loglog_slope(*zip(*sorted((r["n_labels"], r["epoch_seconds"])
                                           for r in rows if r["system"] == s
                                           and r["threads"] == T)))
              for s in a.systems}
    machine = common.machine_description()
    png = out / "scaling.png"
    plotted = plot(rows, a, png)
    head = "| system | labels | threads | s / epoch | s / batch | first batch | " \
           "rehashes / rebuilds | peak RSS | CPU use | vs slide | run |"
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for r in sorted(rows, key=lambda r: (r["n_labels"], r["threads"],
                                         a.systems.index(r["system"]))):
        u = r.get("cpu_utilisation")
        util = "—" if u is None else f"{100 * u:.0f}%"
        ref = by.get(("slide", r["n_labels"], r["threads"]))
        ratio = (r["epoch_seconds"] / ref["epoch_seconds"]
                 if ref and r["system"] != "slide" else None)
        tables = ("—" if r.get("rehashes") is None
                  else f"{r['rehashes']} / {r.get('rebuilds') or 0}")
        first = r.get("first_batch_seconds")
        lines.append(f"| {common.LABELS.get(r['system'], r['system'])} | {r['n_labels']:,} | "
                     f"{r['threads']} | {common.fmt_seconds(r['epoch_seconds'])} | "
                     f"{r['seconds_per_batch']:.4f} | "
                     f"{'—' if first is None else f'{first:.2f} s'} | {tables} | "
                     f"{common.fmt_bytes(r['peak_rss_bytes'])} | "
                     f"{util} | "
                     f"{common.fmt_ratio(ratio)} | "
                     f"{r['source']} |")
    table = "\n".join(lines)
    slope_txt = ", ".join(f"{common.LABELS.get(s, s)}: {v:.2f}" for s, v in slopes.items()
                          if v is not None)
    summary = {"command": command, "machine": machine, "commit": common.git_commit(),
               "settings": {k: v for k, v in vars(a).items()}, "rows": rows,
               "loglog_slope_vs_labels": slopes}
    (out / "scaling.json").write_text(json.dumps(summary, indent=1))
    md = [f"# Cost growth: {a.preset} shape, labels {', '.join(f'{x:,}' for x in a.labels)}", "",
          f"- each point: the fastest of {a.repeat} subprocess(es), each training one whole "
          f"epoch of {a.epoch_points:,} points ({math.ceil(a.epoch_points / a.batch_size)} "
          f"batches of {a.batch_size}), **measured whole**: slide's first table build, "
          f"rehashes and rebuilds included; compilation and tracing (a throw-away warm-up fit) "
          f"and evaluation excluded for every system",
          f"- growth exponent b of time ~ labels^b at {T} threads (1 = linear): {slope_txt}",
          f"- machine: {machine['cpu']}, {machine['cores']} cores, "
          f"{(machine['ram_bytes'] or 0) / 2**30:.0f} GiB RAM; commit {summary['commit']}",
          f"- command: `{command}`", "", table, ""]
    if plotted:
        md.append(f"![time per epoch against labels and threads]({png.name})")
    (out / "scaling.md").write_text("\n".join(md) + "\n")
    print()
    print("\n".join(md[2:5]))
    print()
    print(table)
    return summary


if __name__ == "__main__":
    main()
