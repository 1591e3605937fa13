"""One ``bench/compare.py`` comparison over several seeds, and a table of means and spreads.

    python bench/compare_seeds.py --seeds 0,1,2 --out bench/results/tf_sampled_xc200k_<commit> \\
        -- --data xc200k --n-train 100000 --n-test 5000 --epochs 1 --lr 1e-3 \\
           --num-sampled 2048 --candidate-sampler unigram --tf-target one --tf-head 0 \\
           --slide-param lr_schedule=constant --slide-param rerank=False \\
           --systems slide,tf_sampled --threads 2 --evals-per-epoch 1 --prefault-gib 4 \\
           --lock /tmp/slide.lock

Each seed is a whole ``compare.py`` run (its own data shuffle, data order and initialisation,
shared by every system of that seed) written to ``OUT/seed<S>/``. ``OUT/summary.md`` then gives,
per system, the training time and the time of the epoch from the end of the first batch (mean
and sample standard deviation over seeds), P@1, P@5 and PSP@5, and per seed each baseline's
time divided by slide's (the issue's "speed ÷ TF's"), so that a ratio is always measured side by
side in one run. ``--summarise-only`` rebuilds the summary from existing seed folders.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)


def _mean_sd(values):
    a = np.asarray(values, dtype=np.float64)
    sd = float(a.std(ddof=1)) if a.size > 1 else 0.0
    return float(a.mean()), sd


def _steady_epoch(r):
    """The epoch's time from the end of its first batch, scaled to the whole epoch (slide's
    clock includes building its model; a baseline's starts once its variables exist)."""
    return r["steady_epoch_seconds"]


def summarise(out, seeds, command):
    runs = {}
    for s in seeds:
        with open(os.path.join(out, f"seed{s}", "results.json")) as f:
            runs[s] = json.load(f)
    first = runs[seeds[0]]
    systems = list(first["results"])
    # what the runs measured, not what summarises them (``--summarise-only`` runs later)
    commits = sorted({runs[s].get("commit", "unknown") for s in seeds})
    lines = [f"# {first['data'].get('data')}: {len(seeds)} seeds of `bench/compare.py`", ""]
    if command:
        lines.append(f"- command: `{command}`")
    lines += [f"- seed {seeds[0]}'s run: `{first.get('command', '?')}`",
              f"- commit {', '.join(commits)}; machine: {first['machine'].get('cpu')}, "
              f"{first['machine'].get('cores')} cores; BLAS kernels "
              f"{first['machine'].get('blas', 'not recorded')}",
             f"- settings: {json.dumps(first['settings'])}",
             f"- slide parameters: {json.dumps(first.get('slide_params'))}",
             "- per seed: `seed<S>/results.md`", "",
             "| system | training s (all epochs) | one epoch without setup, s | samples/s "
             "| P@1 | P@5 | PSP@5 |",
             "|---|---|---|---|---|---|---|"]
    for name in systems:
        rs = [runs[s]["results"][name] for s in seeds]
        t = _mean_sd([r["train_seconds"] for r in rs])
        st = _mean_sd([_steady_epoch(r) for r in rs])
        sps = _mean_sd([r["samples_per_second"] for r in rs])
        cells = [f"{t[0]:.2f} ± {t[1]:.2f}", f"{st[0]:.2f} ± {st[1]:.2f}", f"{sps[0]:,.0f}"]
        for k in ("P@1", "P@5", "PSP@5"):
            m = _mean_sd([r["final_test"][k] for r in rs])
            cells.append(f"{m[0]:.4f} ± {m[1]:.4f}")
        lines.append(f"| {rs[0].get('label', name)} | " + " | ".join(cells) + " |")
    if "slide" in systems and len(systems) > 1:
        lines += ["", "Each baseline's time ÷ slide's, seed by seed (both measured in the same "
                  "run); after the semicolon the same for the epoch without setup:", "",
                  "| baseline | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |",
                  "|---|" + "---|" * (len(seeds) + 1)]
        for name in systems:
            if name == "slide":
                continue
            ratios, cells = [], []
            for s in seeds:
                res = runs[s]["results"]
                a = res[name]["train_seconds"] / res["slide"]["train_seconds"]
                b = _steady_epoch(res[name]) / _steady_epoch(res["slide"])
                ratios.append((a, b))
                cells.append(f"{a:.2f}x; {b:.2f}x")
            ma = float(np.mean([r[0] for r in ratios]))
            mb = float(np.mean([r[1] for r in ratios]))
            lines.append(f"| {name} | " + " | ".join(cells) + f" | **{ma:.2f}x**; {mb:.2f}x |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    print(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", required=True, help="output folder (one seed<S>/ inside per seed)")
    ap.add_argument("--summarise-only", action="store_true")
    ap.add_argument("compare_args", nargs=argparse.REMAINDER,
                    help="bench/compare.py's arguments after '--' (not --seed, not --out)")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    extra = [a for a in args.compare_args if a != "--"]
    if "--seed" in extra or "--out" in extra:
        ap.error("--seed and --out are set per seed by this script")
    command = "python bench/compare_seeds.py --seeds {} --out {} -- {}".format(
        args.seeds, args.out, " ".join(extra))
    if not args.summarise_only:
        for s in seeds:
            cmd = [sys.executable, os.path.join(HERE, "compare.py"), *extra, "--seed", str(s),
                   "--out", os.path.join(args.out, f"seed{s}")]
            print(" ".join(cmd), flush=True)
            subprocess.run(cmd, check=True, cwd=ROOT)
    summarise(args.out, seeds, None if args.summarise_only else command)


if __name__ == "__main__":
    main()
