"""The upper bound of any hash in the batched engine: a block whose ids an ORACLE chooses.

    python bench/oracle_bound.py --data datasets/debdeps --epochs 2 --seeds 0,1,2 \\
        --sizes 256,512,1024,2048 --out bench/results/oracle_bound_debdeps

Per batch the batched engine (``slide.network.block``) computes a shared block S of output
neurons for every sample. Two ways to fill a block of about |S| ids, at equal size:

* ``frequency``: ``shared_negatives=|S|`` draws by label frequency (the default engine);
* ``oracle``:   ``|S|/2`` frequency draws plus the union of every sample's top
  ``ceil(4 |S| / 2 / batch)`` logits over ALL labels under the current weights, cut to the
  |S|/2 ids with the highest logit in the batch (computed densely by ``Network.oracle_m`` /
  ``oracle_per_sample``, their seconds not counted as training). They join each sample's exact set C (no importance weight), so the
  frequency draws still estimate, unbiased, the softmax mass outside C.

No LSH can choose a block better than the exact top logits: if the oracle gains neither
accuracy at equal |S| nor the same accuracy at a smaller |S| (differences under two seed
standard deviations), no hash can, and the frequency draw stays. Network alone
(``neighbours=0, rerank=False``), Adam at a constant ``--lr``, the oracle from the first batch
on. Reported per (variant, |S|): the mean active size, training seconds (oracle excluded), P@1,
P@5, PSP@5 over seeds. Writes ``OUT.json`` and ``OUT.md``.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bench.common import git_commit  # noqa: E402
from bench.engine_ab import _machine, load  # noqa: E402


def run(X, Y, Xt, Yt, variant, size, seed, args):
    import slide
    from slide.network.network import Network
    from slide.metrics import evaluate, inverse_propensity
    half = size // 2
    n_shared = size if variant == "frequency" else size - half
    oracle_m = 0 if variant == "frequency" else half
    # each sample offers 4x its share; the batch keeps the |S|/2 ids of highest logit
    per_sample = max(1, math.ceil(4 * half / args.batch_size))
    actives = []
    orig_prepare = Network.prepare

    def prepare(net, *a, **k):          # the study hook, set before the scratch is sized
        net.oracle_m, net.oracle_per_sample = oracle_m, per_sample
        return orig_prepare(net, *a, **k)

    Network.prepare = prepare
    try:
        m = slide.SlideClassifier(learning_rate=args.lr, lr_schedule="constant",
                                  epochs=args.epochs, n_threads=args.threads,
                                  random_state=seed, neighbours=0, rerank=False,
                                  batch_size=args.batch_size, shared_negatives=n_shared)
        m.fit(X, Y, callback=lambda model, info: actives.append(info["active_mean"]))
    finally:
        Network.prepare = orig_prepare
    oracle_s = m.network_.oracle_seconds
    top = m.predict_topk(Xt, k=5)
    res = evaluate(Yt, top, ks=(1, 5), inv_propensity=inverse_propensity(Y))
    return {"variant": variant, "size": size, "seed": seed, "n_shared": n_shared,
            "oracle_m": oracle_m, "oracle_per_sample": per_sample if oracle_m else 0,
            "active_mean": float(np.mean(actives)), "train_seconds": m.train_seconds_ - oracle_s,
            "oracle_seconds": oracle_s, "P@1": res["P@1"], "P@5": res["P@5"],
            "PSP@5": res["PSP@5"]}


def study_arguments(ap, sizes):
    """The arguments every block study takes (this one and ``bench/lsh_block.py``)."""
    ap.add_argument("--data", required=True)
    ap.add_argument("--n-train", type=int, default=None)
    ap.add_argument("--n-test", type=int, default=5000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--sizes", default=sizes)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)


def run_study(args, run, variants):
    """Load the data, compile, and ``run`` every (size, seed, variant), printing each result as
    a JSON line: (commit, (X, Y, Xt, Yt), runs, seconds)."""
    import slide
    commit = git_commit()
    X, Y, Xt, Yt = load(args.data, args.n_train, args.n_test)
    print(f"data {args.data}: {X.shape[0]} train, {Y.shape[1]} labels; commit {commit}",
          flush=True)
    slide.SlideClassifier(epochs=1, n_threads=args.threads, neighbours=0, rerank=False,
                          random_state=0).fit(X[:2048], Y[:2048])       # compile
    runs = []
    t0 = time.perf_counter()
    for size in [int(s) for s in args.sizes.split(",")]:
        for seed in [int(s) for s in args.seeds.split(",")]:
            for variant in variants:
                r = run(X, Y, Xt, Yt, variant, size, seed, args)
                runs.append(r)
                print(json.dumps(r), flush=True)
    return commit, (X, Y, Xt, Yt), runs, time.perf_counter() - t0


def summary(runs, variants, keys):
    """Per (size, variant): the mean and standard deviation over seeds of each of ``keys``."""
    rows = []
    for size in sorted({r["size"] for r in runs}):
        for variant in variants:
            rs = [r for r in runs if r["size"] == size and r["variant"] == variant]
            if not rs:
                continue
            row = {"size": size, "variant": variant, "n": len(rs)}
            for k in keys:
                v = [r[k] for r in rs]
                row[k] = (statistics.mean(v), statistics.stdev(v) if len(v) > 1 else 0.0)
            rows.append(row)
    return rows


def study_head(args, commit, data, title, script):
    """The JSON-less part every study's report opens with: title, data and settings, commit
    and machine, the command."""
    X, Y, Xt, _ = data
    return [f"# {title}: {args.data}", "",
            f"- {X.shape[0]:,} train points, {Y.shape[1]:,} labels, {args.epochs} epoch(s), "
            f"Adam lr {args.lr} constant, batch {args.batch_size}, {args.threads} threads, "
            f"network alone; test: {Xt.shape[0]:,} rows; seeds {args.seeds}",
            f"- commit {commit}; {_machine()}",
            f"- command: `python bench/{script} {' '.join(sys.argv[1:])}`"]


def write_study(args, commit, data, runs, rows, seconds, lines):
    """``args.out``.json (every run, the summary) and ``args.out``.md (``lines``), printed."""
    X, Y, _, _ = data
    out = {"data": args.data, "commit": commit, "machine": _machine(), "settings": vars(args),
           "n_train": X.shape[0], "n_labels": Y.shape[1], "runs": runs, "summary": rows,
           "seconds": seconds}
    with open(args.out + ".json", "w") as f:
        json.dump(out, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    study_arguments(ap, "256,512,1024,2048")
    args = ap.parse_args()
    variants = ("frequency", "oracle")
    commit, data, runs, seconds = run_study(args, run, variants)
    rows = summary(runs, variants, ("active_mean", "train_seconds", "P@1", "P@5", "PSP@5"))
    lines = study_head(args, commit, data, "Oracle bound of the batched engine's block",
                       "oracle_bound.py")
    lines += ["- frequency: |S| frequency draws; oracle: |S|/2 draws + the union of every "
              "sample's top logits over all labels (<= |S|/2 ids, exact, its time excluded)",
              "", "| block | variant | active ids / sample | train s | P@1 | P@5 | PSP@5 |",
              "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['size']} | {row['variant']} | {row['active_mean'][0]:.0f} | "
                     f"{row['train_seconds'][0]:.2f} | "
                     + " | ".join(f"{row[k][0]:.4f} ± {row[k][1]:.4f}"
                                  for k in ("P@1", "P@5", "PSP@5")) + " |")
    lines += ["", "± is the standard deviation over seeds."]
    write_study(args, commit, data, runs, rows, seconds, lines)


if __name__ == "__main__":
    main()
