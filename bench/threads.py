"""Thread scaling: slide's network and TensorFlow's sampled softmax at 1..N threads, side by side.

    python bench/threads.py --data xc200k --n-train 30000 --threads 1,2 \\
        --out bench/results/threads_xc200k

For each thread count, ``bench/compare.py`` trains both systems (each in its own process, the
same data, order, network and settings as the round-3 comparison: hidden 128, Adam lr 1e-3
constant, 2,048 frequency-drawn negatives, one true label per point and step for TF, slide's
network alone) and this script collects their training samples/s. Reported: samples/s per
system and thread count, each system's speed-up over its own 1-thread run, and slide ÷ TF.
On a machine with more cores (``nproc``), pass ``--threads 1,2,4,8,16``. Where TensorFlow is not
installed (the lent 16-core machine has PyTorch only), ``--systems slide,torch_sampled`` runs
the same recipe in PyTorch (``bench/baselines/torch_sampled.py``).
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from bench.common import git_commit  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="xc200k")
    ap.add_argument("--n-train", type=int, default=30000)
    ap.add_argument("--n-test", type=int, default=None,
                    help="test points of the final evaluation (default: all the data has)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--systems", default="slide,tf_sampled")
    ap.add_argument("--out", required=True, help="output path without extension")
    ap.add_argument("extra", nargs="*", help="more bench/compare.py arguments, after '--'")
    args = ap.parse_args()
    commit = git_commit()
    table = {}
    for t in [int(x) for x in args.threads.split(",")]:
        out_dir = f"{args.out}_runs/threads{t}"
        cmd = [sys.executable, os.path.join(HERE, "compare.py"), "--data", args.data,
               "--epochs", str(args.epochs), "--threads", str(t), "--systems", args.systems,
               "--lr", "1e-3", "--num-sampled", "2048", "--candidate-sampler", "unigram",
               "--tf-target", "one", "--slide-param", "lr_schedule=constant",
               "--slide-param", "rerank=False", "--evals-per-epoch", "1", "--out", out_dir]
        if args.n_train:
            cmd[4:4] = ["--n-train", str(args.n_train)]
        if args.n_test:
            cmd[4:4] = ["--n-test", str(args.n_test)]
        if args.extra:
            cmd += args.extra
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT)
        with open(os.path.join(out_dir, "results.json")) as f:
            res = json.load(f)
        for system, r in res["results"].items():
            table.setdefault(system, {})[t] = r["samples_per_second"]
    threads = sorted({t for v in table.values() for t in v})
    sampled = [s for s in ("tf_sampled", "torch_sampled") if s in table and "slide" in table]
    lines = [f"# Thread scaling: {args.data}", "",
             f"- commit {commit}; {args.n_train or 'all'} training points, {args.epochs} "
             f"epoch(s); settings of bench/compare.py's round-3 comparison (see the runs)",
             f"- command: `python bench/threads.py {' '.join(sys.argv[1:])}`", "",
             "| threads | " + " | ".join(f"{s} samples/s (x 1-thread)" for s in table) + " | "
             + "".join(f"slide ÷ {s} |" for s in sampled),
             "|---|" + "---|" * (len(table) + len(sampled))]
    for t in threads:
        cells = []
        for s, v in table.items():
            base = v.get(threads[0])
            cells.append(f"{v[t]:,.0f} ({v[t] / base:.2f}x)" if t in v and base else "—")
        row = f"| {t} | " + " | ".join(cells) + " |"
        for s in sampled:
            ok = t in table["slide"] and t in table[s]
            row += f" {table['slide'][t] / table[s][t]:.2f}x |" if ok else " — |"
        lines.append(row)
    with open(args.out + ".json", "w") as f:
        json.dump({"commit": commit, "settings": vars(args), "samples_per_second": table}, f,
                  indent=1)
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
