"""Equal-cost ablation of the output layer's active set (issue 14).

Each configuration fixes the non-label part of the active set at about ``--size`` neurons and
varies where they come from (LSH candidates, frequency-drawn or uniform shared negatives, random
padding); every configuration is trained with ``--seeds`` seeds on the same data, and reports
P@1, P@5 (exact top-k), train seconds per epoch (Numba compilation excluded: a warm-up fit of
every configuration on a tiny problem runs first) and the active-set diagnostics of
``slide.network.diagnostics`` on training rows after the last epoch.

Writes ``<out>.json``, ``<out>.md`` (mean +- std over seeds; a difference to the reference --
the first configuration -- under 2 std of the difference is called noise) and ``<out>.png``
(P@1 against seconds per epoch).

    flock /tmp/slide-bench.lock python bench/ablation.py --preset xc200k --scale 0.1 --seeds 3
    flock /tmp/slide-bench.lock python bench/ablation.py --preset amazon670k --scale 0.1
    flock /tmp/slide-bench.lock python bench/ablation.py --train D/train.txt --test D/test.txt
"""
import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common  # noqa: E402


def configs(size):
    """name -> SlideClassifier overrides. ``size`` is the target mean active-set size (labels
    included); the shared-negative draw counts given here are first guesses that
    ``calibrate`` replaces by the count whose measured mean active size is ``size``."""
    half = size // 2
    return {
        "freq": dict(sampler="random", shared_negatives=size, negative_power=1.0),
        "lsh+freq": dict(sampler="vanilla", sampler_budget=half, shared_negatives=half,
                         negative_power=1.0),
        "lsh-topk+freq": dict(sampler="topk", sampler_budget=half, shared_negatives=half,
                              negative_power=1.0),
        "uniform": dict(sampler="random", shared_negatives=size, negative_power=0.0),
        "lsh-only": dict(sampler="vanilla", sampler_budget=size, shared_negatives=0,
                         min_active=size),
    }


def expected_distinct(q, n_draws):
    """Expected number of distinct ids in ``n_draws`` draws from the distribution q."""
    return float(-np.expm1(n_draws * np.log1p(-np.minimum(q, 1 - 1e-12))).sum())


def draws_for(q, target):
    """The draw count whose expected number of distinct ids is ``target`` (bisection)."""
    lo, hi = 0, 1
    while expected_distinct(q, hi) < target and hi < 10**9:
        hi *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if expected_distinct(q, mid) < target else (lo, mid)
    return hi


def probe_active(params, X, Y, n_batches):
    """Mean active-set size over batches 3..n_batches of a fresh fit (what training pays)."""
    from slide.estimator import SlideClassifier
    acts = []

    def cb(model, info):
        if info["batch"] > 2:
            acts.append(info["active_mean"])
        return info["batch"] >= n_batches
    SlideClassifier(**dict(params, random_state=0, epochs=1)).fit(X, Y, callback=cb)
    return float(np.mean(acts))


def calibrate(params, X, Y, target, n_batches=12, rounds=2):
    """Set ``shared_negatives`` so that the measured mean active size is about ``target``:
    the frequency draw collapses repeated draws of frequent labels (1,024 draws gave 810
    distinct ids) and LSH ids overlap with them, so equal draw counts are not equal sets.
    Each round measures the active size at the current count on a short probe fit and moves
    the count to where the analytic expected-distinct curve says the rest must come from."""
    params = dict(params)
    if params.get("shared_negatives", 0) == 0:
        return params, probe_active(params, X, Y, n_batches)
    counts = np.bincount(Y.indices, minlength=Y.shape[1]).astype(np.float64)
    q = (counts + 1.0) ** params.get("negative_power", 1.0)
    q /= q.sum()
    act = None
    for _ in range(rounds):
        act = probe_active(params, X, Y, n_batches)
        other = act - expected_distinct(q, params["shared_negatives"])
        params["shared_negatives"] = draws_for(q, max(1.0, target - other))
    return params, probe_active(params, X, Y, n_batches)


def load(args):
    import slide
    from slide.data import read_xc
    if args.train:
        X, Y = read_xc(args.train)
        Xt, Yt = read_xc(args.test)
        return X, Y, Xt, Yt, args.train
    over = {}
    if args.n_train:
        over["n_train"] = args.n_train
    X, Y, Xt, Yt = slide.generate(args.preset, scale=args.scale, seed=args.data_seed, **over)
    return X, Y, Xt, Yt, f"{args.preset} scale {args.scale}"


def run_one(params, X, Y, Xt, Yt, seed, epochs, diag_rows, eval_rows, inv_prop):
    from slide.network import diagnostics as dg
    from slide.estimator import SlideClassifier
    from slide.metrics import evaluate
    # neighbours=0: the ablation compares how the samplers train the network; the vote
    # (slide.rank.vote) would be the same on top of each
    model = SlideClassifier(**dict(params, random_state=seed, epochs=epochs, neighbours=0))
    curve, acts = [], []
    n_batches = (X.shape[0] + model.batch_size - 1) // model.batch_size

    def cb(m, info):
        acts.append(info["active_mean"])
        if info["batch"] % n_batches == 0:
            # epoch end (after its sync): P@1 on the first eval_rows test rows, outside the
            # timed training
            curve.append(dict(epoch=info["epoch"] + 1, train_seconds=m.train_seconds_,
                              P1=float(m.score(Xt[:eval_rows], Yt[:eval_rows]))))
        return False
    t0 = time.perf_counter()
    model.fit(X, Y, callback=cb)
    wall = time.perf_counter() - t0
    topk = model.predict_topk(Xt, k=5)
    ev = evaluate(Yt, topk, ks=(1, 5), inv_propensity=inv_prop)
    out = {"seed": seed, "P@1": ev["P@1"], "P@5": ev["P@5"], "PSP@5": ev["PSP@5"],
           "seconds_per_epoch": model.train_seconds_ / epochs, "wall": wall,
           "active_train": float(np.mean(acts)), "curve": curve}
    if diag_rows:
        d = dg.diagnose(model, X, Y, n_rows=diag_rows, seed=seed)
        out.update(mass=d["mass"], recall32=d["recall"], active=d["active"],
                   lsh=d["sources"]["lsh"], normaliser_ratio=d["normaliser_ratio"])
    return out


def warm_up(base, cfgs):
    """Compile every kernel path the configurations use, on a tiny problem."""
    import slide
    from slide.estimator import SlideClassifier
    X, Y, _, _ = slide.generate("tiny", seed=0)
    for p in cfgs.values():
        q = dict(base, **p)
        q.update(sampler_budget=min(q.get("sampler_budget", 16), 16),
                 shared_negatives=min(q.get("shared_negatives", 8), 8),
                 min_active=min(q.get("min_active", 0), 16), range_pow=max(q["K"] * 3, 6),
                 L=4, epochs=1, random_state=0)
        SlideClassifier(**q).fit(X[:256], Y[:256]).predict_topk(X[:8], k=5)


def summarise(results, names, ref):
    """rows of (name, metric -> (mean, std, note)) ; note "noise" when |diff| < 2 std(diff)."""
    keys = ["P@1", "P@5", "PSP@5", "seconds_per_epoch", "active_train", "active", "mass",
            "recall32", "lsh", "normaliser_ratio"]
    table = []
    for name in names:
        rs = results[name]
        row = {}
        for k in keys:
            v = np.array([r[k] for r in rs if k in r], np.float64)
            if v.size == 0:
                continue
            note = ""
            if name != ref and k in ("P@1", "P@5", "PSP@5", "seconds_per_epoch"):
                w = np.array([r[k] for r in results[ref]], np.float64)
                diff = v.mean() - w.mean()
                sd = math.sqrt(v.var(ddof=1) / v.size + w.var(ddof=1) / w.size) \
                    if v.size > 1 and w.size > 1 else float("nan")
                note = "noise" if (sd == sd and abs(diff) <= 2 * sd) else \
                    ("n/a" if sd != sd else f"{diff:+.4g}")
            row[k] = (float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0, note)
        table.append((name, row))
    return table


def markdown(table, meta):
    cols = [("P@1", "{:.4f}"), ("P@5", "{:.4f}"), ("PSP@5", "{:.4f}"),
            ("seconds_per_epoch", "{:.2f}"), ("active_train", "{:.0f}"), ("active", "{:.0f}"),
            ("mass", "{:.3f}"), ("recall32", "{:.3f}"), ("lsh", "{:.0f}"),
            ("normaliser_ratio", "{:.3f}")]
    lines = [f"# Ablation: {meta['data']} ({meta['n_labels']} labels, {meta['n_train']} train "
             f"rows), size {meta['size']}, {meta['seeds']} seeds, {meta['epochs']} epoch(s)", "",
             f"Commit: {meta.get('commit', 'unknown')}.", "",
             f"Target mean active size {meta['size']} (labels included); each configuration's "
             "shared-negative draw count was calibrated on short probe fits so that its "
             "measured active size matches (active_train = mean over every training batch, "
             "active = on diagnostic rows after the last epoch). Test rows: "
             f"{meta.get('test_rows')}; PSP@5 with Jain et al. propensities (A 0.55, B 1.5).",
             "",
             "mean ± std over seeds; the note after P@1/P@5/PSP@5/s is the difference to "
             f"`{meta['ref']}`, or *noise* when it is under 2 std of the difference. mass = share "
             "of the full softmax mass in the training active set; recall32 = share of the true "
             "top-32 logits in it; lsh = LSH candidates per sample; Zhat/Z = the engine's "
             "normaliser over the exact one.", "",
             "| config | " + " | ".join(c for c, _ in cols) + " |",
             "|---" * (len(cols) + 1) + "|"]
    for name, row in table:
        cells = []
        for c, f in cols:
            if c not in row:
                cells.append("")
                continue
            m, s, note = row[c]
            cells.append(f"{f.format(m)} ± {f.format(s)}" + (f" ({note})" if note else ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Calibrated configurations (draws = shared_negatives):", ""]
    for name, p in meta["configs"].items():
        lines.append(f"- `{name}`: {p}")
    curves = meta.get("curves")
    if curves:
        lines += ["", f"P@1 after each epoch (first {meta.get('eval_rows')} test rows; mean over "
                  "seeds) at cumulative train seconds (ratios within this run only):", "",
                  "| config | " + " | ".join(f"epoch {e + 1}" for e in range(meta["epochs"]))
                  + " |", "|---" * (meta["epochs"] + 1) + "|"]
        for name, pts in curves.items():
            lines.append(f"| {name} | " + " | ".join(f"{p1:.4f} @ {t:.0f} s" for p1, t in pts)
                         + " |")
    return "\n".join(lines) + "\n"


def mean_curves(results, names):
    """name -> [(mean P@1, mean cumulative train seconds)] per epoch."""
    out = {}
    for name in names:
        rs = [r["curve"] for r in results[name] if r.get("curve")]
        if rs:
            n = min(len(c) for c in rs)
            out[name] = [(float(np.mean([c[e]["P1"] for c in rs])),
                          float(np.mean([c[e]["train_seconds"] for c in rs]))) for e in range(n)]
    return out


def plot(curves, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, pts in curves.items():
        ax.plot([t for _, t in pts], [p for p, _ in pts], marker="o", label=name)
    ax.set_xlabel("cumulative train seconds (mean over seeds)")
    ax.set_ylabel("P@1 after each epoch (exact top-k)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="xc200k")
    ap.add_argument("--scale", type=float, default=0.1)
    ap.add_argument("--n-train", type=int, default=None)
    ap.add_argument("--train", default=None, help="XC train file (with --test)")
    ap.add_argument("--test", default=None)
    ap.add_argument("--size", type=int, default=2048,
                    help="target mean active-set size per sample (labels included)")
    ap.add_argument("--test-rows", type=int, default=5000, help="test rows for final metrics")
    ap.add_argument("--eval-rows", type=int, default=2000, help="test rows for per-epoch P@1")
    ap.add_argument("--probe-batches", type=int, default=12)
    ap.add_argument("--configs", nargs="+", default=None, help="subset of the configurations")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--diag-rows", type=int, default=128)
    ap.add_argument("--data-seed", type=int, default=0)
    ap.add_argument("--K", type=int, default=6)
    ap.add_argument("--L", type=int, default=50)
    ap.add_argument("--range-pow", type=int, default=18)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--out", default="bench/results/ablation")
    args = ap.parse_args(argv)
    if bool(args.train) != bool(args.test):
        ap.error("--train and --test go together")
    allc = configs(args.size)
    names = args.configs or list(allc)
    unknown = [n for n in names if n not in allc]
    if unknown:
        ap.error(f"unknown configuration(s) {unknown}; choose from {list(allc)}")
    commit = common.git_commit()
    print(f"commit: {commit}", flush=True)
    X, Y, Xt, Yt, data = load(args)
    base = dict(hidden_sizes=(args.hidden,), learning_rate=args.lr, n_threads=args.threads,
                K=args.K, L=args.L, range_pow=args.range_pow)
    Xt, Yt = Xt[:args.test_rows], Yt[:args.test_rows]
    from slide.metrics import inverse_propensity
    inv_prop = inverse_propensity(Y)
    warm_up(base, {n: allc[n] for n in names})
    cal = {}
    for name in names:
        p, act = calibrate(dict(base, **allc[name]), X, Y, args.size, args.probe_batches)
        cal[name] = {k: v for k, v in p.items() if k in allc[name]}
        print(f"calibrated {name}: {cal[name]} probe active {act:.0f}", flush=True)
    allc = cal
    results = {}
    for name in names:
        results[name] = []
        for s in range(args.seeds):
            r = run_one(dict(base, **allc[name]), X, Y, Xt, Yt, s, args.epochs, args.diag_rows,
                        args.eval_rows, inv_prop)
            results[name].append(r)
            print(f"{name:14s} seed {s}: P@1 {r['P@1']:.4f} P@5 {r['P@5']:.4f} "
                  f"PSP@5 {r['PSP@5']:.4f} {r['seconds_per_epoch']:.2f} s/epoch active "
                  f"{r['active_train']:.0f} mass {r.get('mass', float('nan')):.3f}",
                  flush=True)
    meta = dict(commit=commit,
                data=data, n_labels=int(Y.shape[1]), n_train=int(X.shape[0]), size=args.size,
                seeds=args.seeds, epochs=args.epochs, ref=names[0], test_rows=int(Xt.shape[0]),
                eval_rows=args.eval_rows, configs={n: allc[n] for n in names},
                curves=mean_curves(results, names))
    table = summarise(results, names, names[0])
    with open(args.out + ".json", "w") as f:
        json.dump(dict(commit=commit, meta=meta, results=results), f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(markdown(table, meta))
    plot(meta["curves"], args.out + ".png")
    print(markdown(table, meta))
    return results


if __name__ == "__main__":
    main()
