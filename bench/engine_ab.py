"""The batched engine against the per-sample one, side by side in one run: training seconds and
accuracy of slide's network alone (``neighbours=0, rerank=False``) at equal epochs.

    python bench/engine_ab.py --data datasets/debcontents --epochs 2 --seeds 0,1,2 \\
        --out bench/results/engine_ab_debcontents

``--data``: a directory with train.txt/test.txt (XC format) or a synthetic preset name
(``--n-train`` points). Settings as issue 29's comparison with TensorFlow's sampled softmax:
hidden 128, Adam at a constant ``--lr``, 2,048 shared negatives drawn by label frequency,
log-prior output biases. The engines alternate (per seed: per_sample, then batched) in this
process; one warm-up fit on a slice compiles every kernel first (compile time excluded for
both). Reported per run: training seconds (``train_seconds_``), samples/s, P@1, P@5, PSP@5
on the test set (first ``--n-test`` rows, shuffled once); then per engine the mean and the
standard deviation over seeds, and the speed ratio. Writes ``OUT.json`` and ``OUT.md``.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bench.common import git_commit, machine_description  # noqa: E402

ENGINES = ("per_sample", "batched")


def load(data, n_train, n_test, seed=0):
    import slide
    from slide import synthetic
    if os.path.isdir(data):
        X, Y = slide.read_xc(os.path.join(data, "train.txt"))
        Xt, Yt = slide.read_xc(os.path.join(data, "test.txt"))
    else:
        X, Y, Xt, Yt = synthetic.generate(data, seed=0, n_train=n_train, n_test=n_test)
    if n_train and X.shape[0] > n_train:
        X, Y = X[:n_train], Y[:n_train]
    order = np.random.default_rng(seed).permutation(Xt.shape[0])[:n_test]
    return X, Y, Xt[order], Yt[order]


def run(X, Y, Xt, Yt, engine, seed, args):
    import slide
    from slide.metrics import evaluate, inverse_propensity
    m = slide.SlideClassifier(engine=engine, learning_rate=args.lr, lr_schedule="constant",
                              epochs=args.epochs, n_threads=args.threads, random_state=seed,
                              neighbours=0, rerank=False, batch_size=args.batch_size)
    t0 = time.perf_counter()
    m.fit(X, Y)
    wall = time.perf_counter() - t0
    top = m.predict_topk(Xt, k=5)
    res = evaluate(Yt, top, ks=(1, 5), inv_propensity=inverse_propensity(Y))
    n = X.shape[0] * args.epochs
    return {"engine": engine, "seed": seed, "train_seconds": m.train_seconds_,
            "fit_wall_seconds": wall, "samples_per_second": n / m.train_seconds_,
            "P@1": res["P@1"], "P@5": res["P@5"], "PSP@5": res["PSP@5"]}


def _machine():
    m = machine_description()
    return (f"{m['cpu']}, {m['cores']} cores, {m['ram_bytes'] / 2**30:.0f} GiB RAM; BLAS "
            f"kernels {m['blas']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--n-train", type=int, default=None)
    ap.add_argument("--n-test", type=int, default=5000)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True, help="output path without extension")
    args = ap.parse_args()
    import slide
    commit = git_commit()
    X, Y, Xt, Yt = load(args.data, args.n_train, args.n_test)
    print(f"data {args.data}: {X.shape[0]} train, {Xt.shape[0]} test, {X.shape[1]} features, "
          f"{Y.shape[1]} labels; commit {commit}", flush=True)
    for engine in ENGINES:      # compile both engines' kernels outside the clock
        slide.SlideClassifier(engine=engine, epochs=1, n_threads=args.threads, neighbours=0,
                              rerank=False, random_state=0).fit(X[:2048], Y[:2048])
    runs = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        for engine in ENGINES:
            r = run(X, Y, Xt, Yt, engine, seed, args)
            runs.append(r)
            print(json.dumps(r), flush=True)
    summary = {}
    for engine in ENGINES:
        rs = [r for r in runs if r["engine"] == engine]
        summary[engine] = {k: (statistics.mean(r[k] for r in rs),
                               statistics.stdev(r[k] for r in rs) if len(rs) > 1 else 0.0)
                           for k in ("train_seconds", "samples_per_second", "P@1", "P@5",
                                     "PSP@5")}
    speedup = summary["per_sample"]["train_seconds"][0] / summary["batched"]["train_seconds"][0]
    out = {"data": args.data, "commit": commit, "machine": machine_description(),
           "settings": vars(args), "n_train": X.shape[0], "n_labels": Y.shape[1],
           "runs": runs, "summary": summary, "speedup_batched": speedup}
    with open(args.out + ".json", "w") as f:
        json.dump(out, f, indent=1)
    lines = [f"# Batched vs per-sample engine: {args.data}",
             "",
             f"- {X.shape[0]:,} train points, {Y.shape[1]:,} labels, {args.epochs} epoch(s), "
             f"{args.threads} threads, Adam lr {args.lr} constant, batch {args.batch_size}, "
             f"network alone (neighbours=0, rerank=False); test: {Xt.shape[0]:,} rows",
             f"- commit {commit}; {_machine()}",
             f"- command: `python bench/engine_ab.py {' '.join(sys.argv[1:])}`",
             "",
             "| engine | train s | samples/s | P@1 | P@5 | PSP@5 |",
             "|---|---|---|---|---|---|"]
    for engine in ENGINES:
        s = summary[engine]
        lines.append(f"| {engine} | {s['train_seconds'][0]:.2f} ± {s['train_seconds'][1]:.2f} | "
                     f"{s['samples_per_second'][0]:,.0f} | "
                     + " | ".join(f"{s[k][0]:.4f} ± {s[k][1]:.4f}" for k in ("P@1", "P@5",
                                                                               "PSP@5"))
                     + " |")
    lines += ["", f"Batched speed-up (mean training seconds): {speedup:.2f}x. "
              "± is the standard deviation over seeds."]
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
