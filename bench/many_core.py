"""Batches in flight against one batch at a time: training speed and accuracy of slide's
network (no neighbour vote, no re-ranker) for each (threads, batches_in_flight) layout, all in
one process, layouts interleaved seed by seed so that drift hits them alike.

On the 2-core machine (the README's figures; about 10 minutes):

    flock /tmp/slide-bench.lock python bench/many_core.py --threads 2 \\
        --layouts 1,2,4,8,16 --seeds 0,1,2 --out bench/results/inflight_2core

On a 16-core machine (the prepared command; about 5 minutes, compiling included):

    python bench/many_core.py --threads 1,2,4,8,16 --layouts 1,2,4,8,16 --no-oversubscribe \\
        --seeds 0 --phases 60 --real debcontents=TRAIN,TEST --out bench/results/many_core_COMMIT

``--layouts``: batches_in_flight values; ``auto`` what the estimator's "auto" resolves to,
``half`` one per two threads (groups of two threads); ``--no-oversubscribe`` skips layouts
of more workers than threads (each worker takes a core of its own, so on T threads more than T
workers would use more cores than asked). ``--phases N``: a batch's serial and parallel parts,
timed over N batches for each thread count (``batch_phases``). Writes ``<out>.json``
(``{"machine", "commit", "rows": [{"data", "threads", "batches_in_flight", "seed",
"samples_per_s", "p_at_1", "p_at_5", "psp_at_5", ...}], "phases": [...]}``) and a Markdown
table beside it (mean and standard deviation over seeds, the ratio to one batch at a time on
the same threads and to one thread). Compile time is
excluded for every layout: a warm-up fit on each data set runs first. Data: the synthetic
presets of ``--presets`` (default ``xc200k``, the 200k-label set; ``amazon670k`` the
Amazon-670K shape; ``--n-train`` rows each) and any XC-format train/test pair given with
``--real NAME=TRAIN,TEST``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import git_commit, machine_description  # noqa: E402


def load_sets(args):
    """{name: (X_train, Y_train, X_test, Y_test)}."""
    from slide.data import read_xc
    from slide.synthetic import generate
    sets = {}
    for preset in (args.presets.split(",") if args.synthetic else []):
        sets[preset] = generate(preset, scale=1.0, seed=0, n_train=args.n_train,
                                n_test=args.n_test)
    for spec in args.real:
        name, paths = spec.split("=", 1)
        tr, te = paths.split(",")
        Xtr, Ytr = read_xc(tr)
        Xte, Yte = read_xc(te)
        n_f = max(Xtr.shape[1], Xte.shape[1])
        n_l = max(Ytr.shape[1], Yte.shape[1])
        Xtr.resize((Xtr.shape[0], n_f)), Xte.resize((Xte.shape[0], n_f))
        Ytr.resize((Ytr.shape[0], n_l)), Yte.resize((Yte.shape[0], n_l))
        sets[name] = (Xtr, Ytr, Xte, Yte)
    return sets


def layout_value(name, threads):
    """The batches_in_flight a --layouts entry stands for at ``threads`` threads."""
    if name == "auto":
        from slide.network.inflight import resolve_batches_in_flight
        return resolve_batches_in_flight("auto", threads, True)
    if name == "half":
        return max(1, threads // 2)
    return int(name)


def one_fit(data, threads, in_flight, seed, epochs, whole=False, hidden=(128,), params=None):
    """Train the network alone (``whole``: the default ``SlideClassifier()``, vote and
    re-ranker too, its epochs "auto") of hidden widths ``hidden`` (a tuple or "auto"); its
    speed (samples/s over train_seconds_, compile
    excluded; ``fit_seconds``: the whole fit's wall time less its compile time) and accuracy
    on the test rows."""
    from slide import SlideClassifier
    from slide.metrics import evaluate, inverse_propensity
    Xtr, Ytr, Xte, Yte = data
    settings = {} if whole else dict(neighbours=0, rerank=False, epochs=epochs,
                                     hidden_sizes=hidden)
    settings.update(params or {})
    m = SlideClassifier(random_state=seed, n_threads=threads, batches_in_flight=in_flight,
                        **settings)
    t0 = time.perf_counter()
    m.fit(Xtr, Ytr)
    fit_seconds = time.perf_counter() - t0 - getattr(m, "compile_seconds_", 0.0)
    topk = m.predict_topk(Xte, k=5)
    ev = evaluate(Yte, topk, ks=(1, 5), inv_propensity=inverse_propensity(Ytr))
    return {"threads": threads, "batches_in_flight": in_flight, "seed": seed,
            "train_seconds": m.train_seconds_, "fit_seconds": fit_seconds,
            "samples": int(m.samples_),
            "samples_per_s": m.samples_ / m.train_seconds_, "p_at_1": float(ev["P@1"]),
            "p_at_5": float(ev["P@5"]), "psp_at_5": float(ev.get("PSP@5", np.nan))}


def batch_phases(data, threads, n_batches, hidden=(128,)):
    """A batch's parts, each timed alone over ``n_batches`` batches of the set ``data`` on a
    model that trained one epoch on up to 20,000 of its rows: ``claim`` (drawing the batch's
    negatives and claiming its optimizer step: Python on the thread that feeds the workers,
    one batch after another), ``bind`` (readying the claimed batch on a worker's scratch:
    Python, under the GIL) and ``run`` (the compiled batch, which releases the GIL), at each
    thread count in ``threads``, one batch at a time. Medians in ms. With ``W`` workers the
    claims bound the speed at one batch every ``claim`` ms, the GIL's share at one every
    ``claim + bind`` ms, and the workers at ``W`` batches every ``run`` ms of one thread."""
    import numba
    from slide import SlideClassifier
    from slide.data import iterate_minibatches
    from slide.network import block_step
    from slide.network.trainer import blas_single_thread

    class Capture(SlideClassifier):
        """Keeps the checked training matrices the network trained on."""

        def _train(self, X, Y, end_epoch, eval_set, callback, rows=None):
            self.trained_on_ = (X, Y)
            super()._train(X, Y, end_epoch, eval_set, callback, rows)

    Xtr, Ytr = data[0][:20_000], data[1][:20_000]
    m = Capture(random_state=0, n_threads=max(threads), batches_in_flight=1, neighbours=0,
                rerank=False, epochs=1, hidden_sizes=hidden)
    m.fit(Xtr, Ytr)
    X, Y = m.trained_on_
    net, opt = m.network_, m.optimizer_
    batches = list(iterate_minibatches(X.shape[0], int(m.batch_size), 1, 1, 0))
    rows = []
    old = numba.get_num_threads()
    try:
        with blas_single_thread():
            for t in threads:
                numba.set_num_threads(t)
                times = {"claim": [], "bind": [], "run": []}
                for i in range(n_batches + 5):
                    batch = batches[i % len(batches)]
                    t0 = time.perf_counter()
                    claimed = block_step.claim(net, X, Y, batch, m.seed_, m.batches_ + 1,
                                               opt, t)
                    t1 = time.perf_counter()
                    call = block_step.bind(net, claimed, X)
                    t2 = time.perf_counter()
                    ok, _, _ = block_step.run_batch(call)
                    t3 = time.perf_counter()
                    if not ok:          # nothing applied: the step is not spent
                        opt.cancel_step()
                    m.batches_ += 1
                    if i >= 5:          # the first few touch new pages
                        for k, v in zip(times, (t1 - t0, t2 - t1, t3 - t2)):
                            times[k].append(v * 1e3)
                row = {"threads": t, "batches": n_batches}
                row.update({f"{k}_ms": float(np.median(v)) for k, v in times.items()})
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        numba.set_num_threads(old)
    return rows


def read_bandwidth(threads, gib=1.0, rounds=3):
    """This machine's read bandwidth (GB/s) on ``threads`` threads: the best of ``rounds``
    parallel sums over ``gib`` GiB of float32 (touched first, so no page is mapped inside
    the clock)."""
    import numba
    from numba import njit, prange

    @njit(parallel=True, fastmath=True)
    def total(a):
        s = 0.0
        for i in prange(a.shape[0]):
            s += a[i]
        return s

    a = np.ones(int(gib * (1 << 30)) // 4, np.float32)
    old = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        total(a[:1024])
        best = 0.0
        for _ in range(rounds):
            t0 = time.perf_counter()
            total(a)
            best = max(best, a.nbytes / (time.perf_counter() - t0) / 1e9)
    finally:
        numba.set_num_threads(old)
    return best


def table(rows):
    """Markdown: per data set and threads, each layout's mean (sd) over seeds."""
    out = ["| data | threads | batches_in_flight | samples/s | x one at a time | x 1 thread "
           "| fit s | P@1 | P@5 | PSP@5 | seeds |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["data"], r["threads"], r["batches_in_flight"]) for r in rows})
    base1 = {}
    for d, t, w in keys:
        sel = [r for r in rows if (r["data"], r["threads"], r["batches_in_flight"]) == (d, t, w)]
        sps = np.array([r["samples_per_s"] for r in sel])
        if w == 1:
            base1[(d, t)] = sps.mean()

    def ms(a, f):
        a = np.asarray(a, float)
        return f"{a.mean():{f}} ({a.std(ddof=1) if a.size > 1 else 0:{f}})"

    for d, t, w in keys:
        sel = [r for r in rows if (r["data"], r["threads"], r["batches_in_flight"]) == (d, t, w)]
        sps = np.array([r["samples_per_s"] for r in sel])
        one, thread1 = base1.get((d, t)), base1.get((d, 1))
        ratio_one = f"{sps.mean() / one:.2f}" if one else "-"
        ratio_thread1 = f"{sps.mean() / thread1:.2f}" if thread1 else "-"
        out.append(f"| {d} | {t} | {w} | {ms(sps, '.0f')} | {ratio_one} | {ratio_thread1} | "
                   f"{ms([r['fit_seconds'] for r in sel], '.1f')} | "
                   f"{ms([r['p_at_1'] for r in sel], '.4f')} | "
                   f"{ms([r['p_at_5'] for r in sel], '.4f')} | "
                   f"{ms([r['psp_at_5'] for r in sel], '.4f')} | {len(sel)} |")
    return "\n".join(out)


def phase_table(phases):
    """Markdown: a batch's claim, bind and run (ms, medians) by data set and threads."""
    if not phases:
        return ""
    out = ["\nA batch's parts, one batch at a time (ms, medians; `--phases`):\n",
           "| data | threads | claim | bind | run | batches |", "|---|---|---|---|---|---|"]
    for r in phases:
        out.append(f"| {r['data']} | {r['threads']} | {r['claim_ms']:.3f} | "
                   f"{r['bind_ms']:.3f} | {r['run_ms']:.3f} | {r['batches']} |")
    return "\n".join(out) + "\n"


def parse_param(text):
    """("name", value) of a --param NAME=VALUE (VALUE a Python literal, else the string)."""
    import ast
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"--param wants NAME=VALUE, got {text!r}")
    try:
        return name.strip(), ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name.strip(), value


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="2", help="comma-separated thread counts")
    ap.add_argument("--layouts", default="1,2,4,8,16",
                    help="comma-separated batches_in_flight values (or auto, half)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--n-train", type=int, default=100_000)
    ap.add_argument("--n-test", type=int, default=5_000)
    ap.add_argument("--presets", default="xc200k",
                    help="comma-separated synthetic presets (slide.synthetic.PRESETS)")
    ap.add_argument("--no-synthetic", dest="synthetic", action="store_false",
                    help="no synthetic set (only --real ones)")
    ap.add_argument("--real", action="append", default=[],
                    help="NAME=TRAIN,TEST: an XC-format data set (repeatable)")
    ap.add_argument("--whole", action="store_true",
                    help="the default SlideClassifier() (vote and re-ranker, epochs auto), "
                         "not the network alone")
    ap.add_argument("--hidden", default="128",
                    help="the network-alone runs' hidden widths, comma-separated, or auto "
                         "(the estimator's default: 256 at most shapes); default 128, the "
                         "width of the earlier figures")
    ap.add_argument("--no-oversubscribe", dest="oversubscribe", action="store_false",
                    help="skip layouts of more workers than threads")
    ap.add_argument("--phases", type=int, default=0, metavar="N",
                    help="also time a batch's claim, bind and run over N batches at each "
                         "thread count (0: not)")
    ap.add_argument("--commit", default=None,
                    help="the commit to record where the tree has no git metadata (a copy)")
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                    help="a SlideClassifier setting for every fit (repeatable; the value read "
                         "as a Python literal where it is one, e.g. learning_rate=0.002)")
    ap.add_argument("--out", default="bench/results/inflight")
    args = ap.parse_args(argv)
    hidden = "auto" if args.hidden == "auto" else tuple(int(h) for h in args.hidden.split(","))
    params = dict(parse_param(p) for p in args.param)
    threads = [int(t) for t in args.threads.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    layouts = args.layouts.split(",")
    commit = git_commit()
    if commit == "unknown" and args.commit:
        commit = args.commit + " (as given: the tree had no git metadata)"
    t_start = time.time()
    sets = load_sets(args)
    bandwidth = {t: read_bandwidth(t) for t in threads}
    print("read bandwidth GB/s:", {t: round(b, 1) for t, b in bandwidth.items()}, flush=True)
    rows, phases = [], []
    for name, data in sets.items():
        # compile once, outside every clock (the fit's own warm-up then finds the cache)
        small = tuple(a[:2000] for a in data)
        one_fit(small, threads[0], 1, 0, 1, args.whole, hidden, params)
        one_fit(small, max(threads), 2, 0, 1, args.whole, hidden, params)
        if args.phases:
            for r in batch_phases(data, threads, args.phases, hidden):
                phases.append(dict(r, data=name))
        for seed in seeds:
            for t in threads:
                done = set()
                for lay in layouts:
                    w = layout_value(lay, t)
                    if w in done or (t == 1 and w > 1) or (w > t and not args.oversubscribe):
                        # one thread: a worker each would use more cores than asked
                        continue
                    done.add(w)
                    r = one_fit(data, t, w, seed, args.epochs, args.whole, hidden, params)
                    r["data"] = name
                    rows.append(r)
                    print(json.dumps(r), flush=True)
    result = {"machine": machine_description(), "commit": commit, "args": vars(args),
              "seconds": time.time() - t_start, "read_bandwidth_gb_s": bandwidth, "rows": rows,
              "phases": phases}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    md = table(rows)
    out.with_suffix(".md").write_text(
        f"# Batches in flight ({commit})\n\nMachine: {result['machine']}\n\n"
        f"`python bench/many_core.py {' '.join(argv or sys.argv[1:])}`\n\n{md}\n\n"
        f"Read bandwidth (GB/s, by threads): {bandwidth}\n" + phase_table(phases))
    print(md)


if __name__ == "__main__":
    main()
