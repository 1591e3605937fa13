"""slide against dense TensorFlow-CPU, TF sampled softmax, PyTorch-CPU and label trees (Omikuji,
napkinXC): time to accuracy.

    python bench/compare.py --data xc200k --n-train 100000 --epochs 1 --threads 2 \\
        --out bench/results/compare_xc200k

Every system trains in its own subprocess on the same prepared data (shuffled once with
``--seed``), with the same network (sparse input -> 128 ReLU -> softmax over all labels), loss
(softmax cross-entropy, 1/|y| targets), Adam, batch size, learning rate, initialisation scale,
epochs and threads, and is evaluated at fixed intervals on the same first ``--n-eval`` shuffled
test points (evaluation excluded from training seconds), then once on all ``--n-test`` points.

Writes ``results.json``, ``results.md`` and ``time_to_accuracy.png`` into ``--out`` and prints the
table last. ``--reuse`` takes a baseline's result from the cache (``bench/out/cache/results``)
when one exists for exactly the same data and settings, so that slide can be rerun alone;
``--reuse-systems slide,...`` also reuses slide's (same data and settings; its row then names
the commit and engine-source digest it was measured at). The table says which run each row
comes from.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common, worker  # noqa: E402
from bench.common import fmt_bytes, fmt_ratio, fmt_seconds  # noqa: E402

SLIDE_FLAGS = {  # flag -> SlideClassifier keyword (passed only when given)
    "hash_family": str, "K": int, "L": int, "range_pow": int, "bucket_size": int,
    "bucket_policy": str, "sampler": str, "sampler_budget": int, "min_active": int,
    "rehash_period": int, "rebuild_period": int, "rehash_decay": float, "loss": str,
    "optimizer": str,
}
# slide first: tf_sampled's default negatives come from slide's active set
ORDER = ("slide", "slide_lsh", "slide_dense", "tf", "torch", "tf_sampled", "torch_sampled",
         "omikuji", "omikuji_bonsai", "napkinxc")


def _tf_head(a, num_sampled):
    """The head TF's sampled softmax gets: slide's (its exact_head share of the negatives,
    unless --slide-param sets another) or --tf-head's number."""
    if a.tf_head != "slide":
        return int(a.tf_head)
    from slide.params import BY_NAME
    share = a.slide_params.get("exact_head", BY_NAME["exact_head"].default)
    return int(int(num_sampled) * float(share))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", required=True, help="preset name (slide.synthetic.PRESETS) or a "
                   "directory with train.txt/test.txt, or 'TRAIN,TEST' XC files")
    p.add_argument("--scale", type=float, default=1.0, help="preset scale (features, labels, "
                   "points); use --n-train to shrink points only")
    p.add_argument("--n-train", type=int, default=None, help="training points (labels unchanged)")
    p.add_argument("--n-test", type=int, default=None, help="test points of the final evaluation")
    p.add_argument("--n-eval", type=int, default=2000,
                   help="first shuffled test points evaluated during training (the curves)")
    p.add_argument("--seed", type=int, default=0, help="data, shuffle and model seed")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--busy", type=int, default=0, help="single-threaded busy loops running "
                   "beside every system's run (another user's jobs on a shared machine)")
    p.add_argument("--prefault-gib", type=float, default=0.0, help="GiB every system's "
                   "process touches and frees before its clock starts, so that no system's "
                   "clock times a virtual machine's host backing fresh memory "
                   "(bench.common.prefault); about the largest system's peak memory")
    p.add_argument("--threads", type=int, default=None, help="threads of every system "
                   "(default: all cores)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--systems", default="slide,tf,tf_sampled,torch",
                   help="comma list from slide, slide_lsh, slide_dense, tf, tf_sampled, torch, "
                   "torch_sampled, omikuji, omikuji_bonsai, napkinxc")
    ev = p.add_mutually_exclusive_group()
    ev.add_argument("--eval-every-batches", type=int, default=None)
    ev.add_argument("--eval-every-seconds", type=float, default=None,
                    help="training seconds between evaluations")
    ev.add_argument("--evals-per-epoch", type=int, default=None,
                    help="evaluations per epoch (the default, 8, when no interval is given)")
    p.add_argument("--max-batches", type=int, default=None,
                   help="stop every system after this many batches (smoke tests)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (all systems)")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--init", default="glorot_normal+log_prior",
                   help="dense baselines' initialisation; glorot_normal is slide's "
                   "(slide.kernels.layers); +log_prior starts the output biases at slide's log "
                   "label prior (slide's default output_bias_init), as slide does")
    p.add_argument("--num-sampled", default="auto", help="tf_sampled's and torch_sampled's "
                   "negatives per batch; 'auto' = slide's mean active-set size in this "
                   "comparison (else 1024)")
    p.add_argument("--candidate-sampler", default="unigram",
                   choices=["uniform", "log_uniform", "unigram"],
                   help="tf_sampled candidate sampler (synthetic label ids are in random "
                   "popularity order, so log-uniform's Zipf-by-id prior does not apply; "
                   "unigram draws in proportion to training label count + 1, as slide does)")
    p.add_argument("--tf-head", default="slide",
                   help="tf_sampled's and torch_sampled's exact head: the N most frequent "
                   "labels in every batch's negatives with expected count 1, the rest of "
                   "--num-sampled drawn from the other labels (slide's exact_head); 'slide' = "
                   "the head slide's defaults give at this --num-sampled, 0 = none")
    p.add_argument("--tf-target", default="all", choices=["all", "one"],
                   help="tf_sampled's target per point and step: all (one row per true label, "
                   "weighted 1/|y|: estimates slide's loss) or one (one true label drawn "
                   "uniformly per point and step, weight 1: the stock TF recipe, fewer rows)")
    p.add_argument("--torch-device", default=None,
                   help="device of the PyTorch baselines (torch, torch_sampled), e.g. cuda; "
                   "default cpu")
    p.add_argument("--target-p1", type=float, default=None, help="target P@1 (default: the "
                   "dense TF model's P@1 after one epoch on the evaluation sample)")
    p.add_argument("--reuse", action="store_true",
                   help="reuse cached baseline results for identical data and settings")
    p.add_argument("--reuse-systems", default=None,
                   help="comma list of systems whose cached results to reuse (may include "
                   "slide: same data and settings; the row names its commit and engine digest)")
    p.add_argument("--no-warmup", action="store_true",
                   help="time slide's Numba compilation as training")
    p.add_argument("--cache-dir", default=str(common.DEFAULT_CACHE))
    p.add_argument("--lock", default=None, help="run each system's process under "
                   "'flock LOCK' (e.g. /tmp/slide-bench.lock) to serialise with other heavy runs")
    p.add_argument("--timeout", type=float, default=None, help="seconds per system")
    g = p.add_argument_group("slide hyperparameters (engine defaults when not given)")
    for name, typ in SLIDE_FLAGS.items():
        g.add_argument("--" + name.replace("_", "-"), dest="slide_" + name, type=typ,
                       default=None)
    g.add_argument("--slide-param", action="append", default=[], metavar="KEY=VALUE",
                   help="any other SlideClassifier keyword (Python literal value)")
    a = p.parse_args(argv)
    a.systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    bad = [s for s in a.systems if s not in common.SYSTEMS]
    if bad:
        p.error(f"unknown systems {bad}")
    a.threads = a.threads or common.machine_description()["cores"]
    a.reuse_set = set(common.BASELINES) if a.reuse else set()
    if a.reuse_systems:
        a.reuse_set |= {s.strip() for s in a.reuse_systems.split(",") if s.strip()}
    a.slide_params = {}
    for name in SLIDE_FLAGS:
        v = getattr(a, "slide_" + name)
        if v is not None:
            a.slide_params[name] = v
    for kv in a.slide_param:
        k, _, v = kv.partition("=")
        try:
            a.slide_params[k.strip()] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            a.slide_params[k.strip()] = v
    return a


def base_spec(a, meta, system):
    return {"system": system, "meta": meta, "threads": a.threads, "hidden": a.hidden,
            "lr": a.lr, "init": a.init, "seed": a.seed, "batch_size": a.batch_size,
            "epochs": a.epochs, "n_eval": a.n_eval, "eval_every_batches": a.eval_every_batches,
            "eval_every_seconds": a.eval_every_seconds, "evals_per_epoch": a.evals_per_epoch,
            "max_batches": a.max_batches, "warmup": not a.no_warmup,
            "prefault_gib": a.prefault_gib,
            "slide_params": a.slide_params if system.startswith("slide") else None,
            **({"torch_device": a.torch_device}
               if a.torch_device and system.startswith("torch") else {})}


def _engine_digest():
    """Digest of slide's own source (every .py under slide/) and the slide runner: a cached
    slide result is reused only for exactly the engine code that produced it."""
    h = hashlib.sha1()
    for f in sorted((common.REPO / "slide").rglob("*.py")) + [Path(__file__).parent /
                                                           "slide_runner.py"]:
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


# settings of slide's engine the environment makes: its threading layer
# (slide.kernels.threads) and the width of its vectors (slide.kernels.codegen)
MEASUREMENT_ENV = ("NUMBA_THREADING_LAYER", "SLIDE_VECTOR_WIDTH")


def measurement_env():
    """The variables of MEASUREMENT_ENV this run sets: part of its command and cache keys."""
    return {k: os.environ[k] for k in MEASUREMENT_ENV if os.environ.get(k)}


def cache_path(a, spec):
    """Result cache file of one system: keyed by data, every shared setting, the system's own
    settings and a digest of its source (the baseline's file, or the whole engine)."""
    keep = {k: v for k, v in spec.items() if k not in ("meta", "warmup")}
    if not keep.get("prefault_gib"):
        keep.pop("prefault_gib", None)      # the keys of results cached before the option
    # a run beside busy loops, or with another threading layer or vectors' width, is another
    # measurement
    if a.busy:
        keep["busy"] = a.busy
    keep.update({k.lower(): v for k, v in measurement_env().items()})
    if spec["system"].startswith("slide"):
        # not keyed by engine source (it changes with every edit while it is being tuned);
        # the result records the commit and the engine digest, shown in the table's run column
        src = "engine"
    else:
        keep.pop("slide_params", None)
        src = worker.source_digest(spec["system"])
    raw = json.dumps([spec["meta"]["key"], keep, src], sort_keys=True)
    key = hashlib.sha1(raw.encode()).hexdigest()[:16]
    return Path(a.cache_dir) / "results" / f"{spec['system']}-{key}.json"


def epoch_time(r):
    """(seconds per epoch, how it was obtained)."""
    if r.get("epoch_seconds"):
        return sum(r["epoch_seconds"]) / len(r["epoch_seconds"]), "measured"
    if r.get("extrapolated_epoch_seconds"):
        return r["extrapolated_epoch_seconds"], "extrapolated"
    return None, None


def default_target(results, a):
    """The dense TF model's P@1 after one epoch (first epoch-end evaluation); falls back to
    PyTorch's, then to the best baseline's last point, and says which was used."""
    if a.target_p1 is not None:
        return a.target_p1, "given with --target-p1"
    for s in ("tf", "torch"):
        r = results.get(s)
        if not r or not r["curve"]:
            continue
        bpe = r["batches_per_epoch"]
        pts = [c for c in r["curve"] if c["batch"] == bpe]
        if pts:
            return pts[0]["P@1"], f"{system_label(s, r)} after one epoch"
        return r["curve"][-1]["P@1"], f"{system_label(s, r)} at its last evaluation " \
            f"(batch {r['curve'][-1]['batch']}, less than one epoch)"
    if "slide" in results and results["slide"]["curve"]:
        return results["slide"]["curve"][-1]["P@1"], "slide's last evaluation (no dense baseline)"
    return None, "none"


def label_prior_p1(meta, n_eval):
    """P@1 of predicting the 5 most frequent training labels for every point: the floor a
    target P@1 has to clear (on the evaluation sample and on the whole test split)."""
    _, Y_tr, _, Y_te = common.load_data(meta)
    top = np.argsort(-np.bincount(Y_tr.indices, minlength=Y_tr.shape[1]), kind="stable")[:5]
    out = {"labels": top.tolist()}
    for name, Y in (("eval", Y_te[:n_eval]), ("test", Y_te)):
        out[f"{name}_P@1"] = common.evaluate_topk(Y, np.tile(top, (Y.shape[0], 1)))["P@1"]
    return out


def system_label(system, result):
    """The table's name of a system; a PyTorch baseline run on a GPU says so."""
    label = common.LABELS.get(system, system)
    dev = str(result.get("torch_device") or "cpu")
    return label if dev == "cpu" else label.replace("PyTorch-CPU", f"PyTorch on {dev}")


def make_table(results, order, target):
    slide = results.get("slide")
    s_epoch = epoch_time(slide)[0] if slide else None
    s_ttt = common.time_to_target(slide["curve"], target) if slide and target else None
    rows = []
    head = ("| system | run | training time | time / epoch | samples/s | time to target P@1 | "
            "final P@1 | final P@3 | final P@5 | PSP@1 | PSP@3 | PSP@5 | peak RSS | CPU use | "
            "epoch time ÷ slide | epoch without setup ÷ slide | time-to-target ÷ slide | "
            "peak RSS ÷ slide |")
    rows.append(head)
    rows.append("|" + "---|" * head.count("|")[:-1] if False else
                "|" + "|".join(["---"] * (head.count("|") - 1)) + "|")
    for s in order:
        r = results[s]
        ep, how = epoch_time(r)
        ttt = common.time_to_target(r["curve"], target) if target is not None else None
        best = max((c["P@1"] for c in r["curve"]), default=None)
        ttt_s = fmt_seconds(ttt) if ttt is not None else (
            f"not reached (best {best:.3f})" if best is not None else "—")
        f = r.get("final_test") or {}
        fin = lambda k: f"{f[k]:.4f}" if k in f else "—"  # noqa: E731
        ratio_ep = ep / s_epoch if (s != "slide" and ep and s_epoch
                                    and not r.get("one_shot")) else None
        ratio_steady = (r["steady_epoch_seconds"] / slide["steady_epoch_seconds"]
                        if s != "slide" and slide and r.get("steady_epoch_seconds")
                        and slide.get("steady_epoch_seconds") and not r.get("one_shot")
                        else None)
        ratio_ttt = ttt / s_ttt if (s != "slide" and ttt and s_ttt) else None
        ratio_mem = (r["peak_rss_bytes"] / slide["peak_rss_bytes"]
                     if s != "slide" and slide else None)
        ep_s = fmt_seconds(ep) + (" (extrap.)" if how == "extrapolated" else "")
        run = r.get("_source", "this run")
        u = r.get("cpu_utilisation")
        util = "—" if u is None else f"{100 * u:.0f}%"
        if r.get("one_shot"):
            ep_s = "— (one fit)"
        sps = r.get("samples_per_second")
        rows.append(f"| {system_label(s, r)} | {run} | {fmt_seconds(r['train_seconds'])} | "
                    f"{ep_s} | {'—' if sps is None else f'{sps:.0f}'} | {ttt_s} | "
                    f"{fin('P@1')} | {fin('P@3')} | {fin('P@5')} | {fin('PSP@1')} | "
                    f"{fin('PSP@3')} | {fin('PSP@5')} | {fmt_bytes(r['peak_rss_bytes'])} | "
                    f"{util} | {fmt_ratio(ratio_ep)} | {fmt_ratio(ratio_steady)} | "
                    f"{fmt_ratio(ratio_ttt)} | "
                    f"{fmt_ratio(ratio_mem)} |")
    return "\n".join(rows)


def plot(results, order, target, path, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[plot] matplotlib is not installed (bench extra); no PNG written")
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for ax, logx in zip(axes, (False, True)):
        for s in order:
            c = results[s]["curve"]
            if not c:
                continue
            ax.plot([p["train_seconds"] for p in c], [p["P@1"] for p in c], marker="o", ms=3,
                    label=common.LABELS.get(s, s))
        if target is not None:
            ax.axhline(target, ls="--", c="grey", lw=1, label=f"target P@1 {target:.3f}")
        ax.set_xlabel("training seconds (evaluation excluded)" + (", log scale" if logx else ""))
        ax.set_ylabel("P@1 on the evaluation sample")
        if logx:
            from matplotlib.ticker import NullFormatter
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels overlap on short spans
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _run_systems(a, meta, order, work):
    """Every system of ``order`` in its own process (or reused from the cache), in order."""
    results = {}
    for s in order:
        spec = base_spec(a, meta, s)
        if s in common.SAMPLED:
            act = (results.get("slide") or {}).get("active_mean")
            if a.num_sampled == "auto":
                spec["num_sampled"] = int(round(act)) if act else 1024
            else:
                spec["num_sampled"] = int(a.num_sampled)
            spec["num_sampled"] = max(1, min(spec["num_sampled"], meta["n_labels"]))
            spec["candidate_sampler"] = a.candidate_sampler
            spec["tf_target"] = a.tf_target
            spec["tf_head"] = _tf_head(a, spec["num_sampled"])
        cp = cache_path(a, spec)
        if s in a.reuse_set and cp.exists():
            r = json.loads(cp.read_text())
            r["_source"] = f"reused: {r['finished_at']}, commit {r['commit']}" + (
                f", engine {r['engine_digest']}" if r.get("engine_digest") else "")
            print(f"[{s}] reusing {cp} ({r['_source']})")
        else:
            if s.startswith("slide"):
                spec["engine_digest"] = _engine_digest()
            r = common.run_in_subprocess(spec, work, timeout=a.timeout, lock=a.lock)
            if s.startswith("slide"):
                r["engine_digest"] = spec["engine_digest"]
            r["_source"] = f"this run ({r['finished_at']})"
            cp.parent.mkdir(parents=True, exist_ok=True)
            cp.write_text(json.dumps(r))
        results[s] = r
    return results


def main(argv=None):
    a = parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.cache_dir) / "runs" / time.strftime("%Y%m%d-%H%M%S")
    command = "".join(f"{k}={v} " for k, v in measurement_env().items()) + \
        "python bench/compare.py " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:]))
    meta = common.prepare_data(a.data, a.scale, a.n_train, a.n_test, a.seed, a.cache_dir)
    # slide first: tf_sampled's default number of negatives is slide's mean active-set size
    order = sorted(a.systems, key=ORDER.index)
    with common.busy_loops(a.busy):
        results = _run_systems(a, meta, order, work)
    target, target_how = default_target(results, a)
    prior = label_prior_p1(meta, a.n_eval)
    if target is not None and target <= prior["eval_P@1"]:
        target_how += (f"; NOT above the label prior's P@1 {prior['eval_P@1']:.4f} on the same "
                       "points: pass a higher --target-p1")
    table = make_table(results, order, target)
    machine = common.machine_description()
    title = (f"{meta['data']}: {meta['n_labels']:,} labels, {meta['n_features']:,} features, "
             f"{meta['n_train']:,} train points; {a.epochs} epoch(s), {a.threads} threads")
    png = out / "time_to_accuracy.png"
    plotted = plot(results, order, target, png, title)
    summary = {
        "command": command, "data": meta, "target_p1": target, "target_source": target_how,
        "label_prior": prior, "propensity": {"A": common.PROPENSITY_A, "B": common.PROPENSITY_B},
        "machine": machine, "commit": common.git_commit(),
        "settings": {k: v for k, v in base_spec(a, meta, "x").items()
                     if k not in ("meta", "system", "slide_params")},
        "slide_params": a.slide_params,
        "results": {s: {k: v for k, v in r.items() if k != "batch_end_seconds"}
                    for s, r in results.items()},
        "time_to_target": {s: common.time_to_target(results[s]["curve"], target)
                           if target is not None else None for s in order},
        "epoch_seconds": {s: epoch_time(results[s])[0] for s in order},
    }
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    md = [f"# {title}", "",
          f"- data: `{meta['data']}` (scale {meta['scale']}), {meta['n_train']:,} train / "
          f"{meta['n_test']:,} test points, {meta['n_features']:,} features, "
          f"{meta['n_labels']:,} labels, {meta['avg_nnz']:.1f} nonzeros and "
          f"{meta['avg_labels']:.2f} labels per point; shuffled once with seed {meta['seed']}",
          f"- settings: hidden {a.hidden} ReLU, batch {a.batch_size}, Adam lr {a.lr}, "
          f"{a.epochs} epoch(s), {a.threads} threads, baselines' init {a.init}; "
          f"curves on the first {a.n_eval} shuffled test points, final P@k on all "
          f"{meta['n_test']:,}",
          f"- slide hyperparameters: {a.slide_params or 'engine defaults'}"
          + "".join(f"; {s}: {results[s].get('num_sampled')} sampled negatives "
                    f"({results[s].get('candidate_sampler')}), target "
                    f"{results[s].get('tf_target', 'all')}"
                    for s in common.SAMPLED if s in results),
          *([f"- each system's process touched and freed {a.prefault_gib:g} GiB of memory "
             "before its clock started (`--prefault-gib`: this virtual machine's host backs "
             "memory it took back at ~2.3 s per GiB on its first touch; bench.common.prefault)"]
            if a.prefault_gib else []),
          f"- target P@1: {target:.4f} ({target_how})" if target is not None else
          "- target P@1: none",
          f"- label prior (the 5 most frequent training labels for every point): P@1 "
          f"{prior['eval_P@1']:.4f} on the evaluation sample, {prior['test_P@1']:.4f} on all "
          f"test points; PSP@k with Jain et al. propensities A={common.PROPENSITY_A}, "
          f"B={common.PROPENSITY_B} from the training labels",
          f"- machine: {machine['cpu']}, {machine['cores']} cores, "
          f"{(machine['ram_bytes'] or 0) / 2**30:.0f} GiB RAM; commit {summary['commit']}",
          f"- BLAS kernels: {machine.get('blas', 'not recorded')}",
          f"- command: `{command}`", "",
          table, "",
          "Training seconds exclude evaluation; time to target is interpolated between the two "
          "evaluations around the crossing. Ratios are baseline ÷ slide (higher = slide faster "
          "or leaner); 'without setup' times each system's epoch from the end of its first "
          "batch (slide's clock includes building its model -- weight init, optimizer "
          "buffers -- and a dense baseline's starts after its variables are built). "
          "CPU use = process CPU seconds ÷ (training seconds × threads) during "
          "training: well below 100% means the process did not keep its cores busy (Python "
          "overhead, memory stalls, or another process on the shared machine).", ""]
    if plotted:
        md.append(f"![P@1 against training seconds]({png.name})")
    (out / "results.md").write_text("\n".join(md) + "\n")
    print()
    print("\n".join(md[:7]))
    print()
    print(table)
    return summary


if __name__ == "__main__":
    main()
