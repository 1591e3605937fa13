"""Kernel compilation time of a fit, cold (empty Numba cache) and warm (loaded from the cache).

Each measurement is a fresh interpreter with ``NUMBA_CACHE_DIR`` pointing at one temporary
directory: the first run of a configuration finds it empty and compiles (cold), the next run
loads the cached machine code (warm). A measurement is ``slide.warmup.warm_up`` of the
configuration -- what ``SlideClassifier.fit`` reports as ``compile_seconds_`` -- followed by a
short real fit whose first batch is timed against the later ones and whose kernels must gain
no new type signature (the warm-up compiled everything the fit uses).

With a cold cache the warm-up starts a helper process that compiles the stages after the
network (``slide.warmup.start_helper``); its kernels are not in a row's "kernels compiled" (they
compile in the other process). ``--helper-rounds N`` then times N more cold warm-ups of slide's
defaults with the helper off and on (``SLIDE_COMPILE_HELPER``), alternating, each in a fresh
empty cache.

``--first-fit FILE`` measures instead what a new user's first run costs: in a fresh interpreter
with an empty cache, ``slide.read_xc(FILE)`` and ``SlideClassifier(random_state=0).fit`` on what
it read (all cores), each timed, then the same again in a second interpreter on the cache the
first one filled (``--rows N``: the fit on the file's first N rows, a small set; ``--params
JSON``: the estimator's other hyperparameters, e.g. ``'{"rerank": false}'``); each process's
seconds inside Python's cyclic garbage collector and its peak memory beside them.
``--reads FILE ...`` measures ``read_xc`` alone on each file, in fresh interpreters: by NumPy
(what a first read takes while the parser is not compiled), by the parser with an empty cache
(its compile included) and by the parser from the cache (``--rounds`` times each); the NumPy
reader's size bound rests on it. ``--tree DIR`` measures the slide of another checkout;
``--before DIR`` adds a second checkout (an earlier commit) measured the same way, alternating
with the first, ``--rounds`` times each (a fresh empty cache every round), so that a
before-and-after shares one run of the machine; ``--warm-fits N`` then times N more warm fits of
each, alternating, for the network's training speed.

    flock -x /tmp/slide.lock python bench/compile_time.py --out bench/results/compile_time.md
    flock -x /tmp/slide.lock python bench/compile_time.py --first-fit debtags/train.txt \
        --before ../slide-before --rounds 2 --warm-fits 4 --out bench/results/first_fit.md
    flock -x /tmp/slide.lock python bench/compile_time.py --reads debtags/train.txt \
        datasets/debcontents/train.txt --rounds 3 --out bench/results/reading.md
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# the quickstart's two phases: slide (the defaults: sampler "random", softmax, Adam, the vote
# and re-ranker) and the dense baseline (sampler "dense": BLAS output layer, the other kernels)
CONFIGS = {"slide (defaults: random sampler, vote, re-ranker)": {},
           "dense baseline (sampler dense)": {"sampler": "dense"}}

CHILD = r"""
import json, sys, time
t_start = time.perf_counter()
import numpy as np
import slide
from slide import warmup
from numba.core import event
t_import = time.perf_counter() - t_start
params = json.loads(sys.argv[1])
X, Y, Xt, Yt = slide.generate("xc200k", scale=0.05, n_train=3000, n_test=300, seed=0)
model = slide.SlideClassifier(**dict(dict(random_state=0, n_threads=2, learning_rate=1e-3),
                                     **params))
model._checked_params()
with event.install_recorder("numba:compile") as rec:
    compile_s = model._warm_up(X, Y)      # what fit(X, Y) compiles
compiled = sorted({e.data["dispatcher"].py_func.__module__ + "."
                   + e.data["dispatcher"].py_func.__name__ for _, e in rec.buffer if e.is_start})
before = warmup.kernel_signatures()
marks = []
model.fit(X, Y, eval_set=(Xt, Yt), callback=lambda m, info: marks.append(info["train_seconds"]))
per_batch = np.diff([0.0] + marks)
print(json.dumps({"import_s": t_import, "compile_s": compile_s,
                  "compiled_kernels": compiled, "n_compiled": len(compiled),
                  "new_signatures": {k: v for k, v in warmup.kernel_signatures().items()
                                     if v != before.get(k, 0)},
                  "first_batch_s": float(per_batch[0]),
                  "median_batch_s": float(np.median(per_batch[1:])),
                  "fit_compile_s": model.compile_seconds_}))
"""


FIRST_FIT_CHILD = r"""
import collections, gc, json, resource, sys, time
t_start = time.perf_counter()
from numba.core import event

# seconds inside Python's cyclic collector (each collection, its finalisers included)
gc_seconds, _gc_start = [0.0], [0.0]


def _gc_timer(phase, info):
    if phase == "start":
        _gc_start[0] = time.perf_counter()
    else:
        gc_seconds[0] += time.perf_counter() - _gc_start[0]


gc.callbacks.append(_gc_timer)


class Own(event.Listener):
    # each kernel's own compile seconds: from its start to its end, less the kernels it
    # compiled meanwhile (the callees a call site's typing compiles first)
    def __init__(self):
        self.stack, self.own, self.count = [], collections.Counter(), collections.Counter()

    def on_start(self, ev):
        self.stack.append([time.perf_counter(), 0.0])

    def on_end(self, ev):
        t0, inner = self.stack.pop()
        seconds = time.perf_counter() - t0
        f = ev.data["dispatcher"].py_func
        name = f.__module__ + "." + f.__name__
        self.own[name] += seconds - inner
        self.count[name] += 1
        if self.stack:
            self.stack[-1][1] += seconds


own = Own()
event.register("numba:compile", own)

# LLVM's part of the compile: seconds in Numba's calls to its function passes, module passes
# and machine-code generation, a library at a time, and which libraries were linked into
# another (a callee's code, optimised and generated once for itself and again in its caller).
# Keyed by the library objects themselves (their names repeat: every overload's "impl")
llvm, linked = collections.defaultdict(lambda: collections.Counter()), set()


def _timed(cls, method, part):
    orig = getattr(cls, method)

    def timed(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return orig(self, *args, **kwargs)
        finally:
            llvm[self][part] += time.perf_counter() - t0
    setattr(cls, method, timed)


try:
    from numba.core import codegen
    _timed(codegen.CPUCodeLibrary, "_optimize_functions", "function passes")
    _timed(codegen.CPUCodeLibrary, "_optimize_final_module", "module passes")
    _timed(codegen.JITCodeLibrary, "_finalize_specific", "machine code")
    _link = codegen.CPUCodeLibrary.add_linking_library

    def _linking(self, library):
        linked.add(library)
        return _link(self, library)
    codegen.CPUCodeLibrary.add_linking_library = _linking
except (ImportError, AttributeError):    # another Numba's layout: no LLVM figures
    pass
import slide
t_import = time.perf_counter() - t_start
path, n_rows, params = json.loads(sys.argv[1])
t0 = time.perf_counter()
X, Y = slide.read_xc(path)
t_read = time.perf_counter() - t0
if int(n_rows) > 0:                     # the fit takes the file's first rows only
    X, Y = X[:int(n_rows)], Y[:int(n_rows)]
t0 = time.perf_counter()
model = slide.SlideClassifier(**dict(params, random_state=0)).fit(X, Y)
t_fit = time.perf_counter() - t0
print(json.dumps({"import_s": t_import, "read_s": t_read, "fit_s": t_fit,
                  "compile_s": model.compile_seconds_, "train_s": model.train_seconds_,
                  "rows": int(X.shape[0]), "labels": int(Y.shape[1]),
                  "slide": slide.__file__, "gc_s": gc_seconds[0],
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "kernels": [[k, own.count[k], s] for k, s in own.own.most_common()],
                  "llvm": {"all": sum(llvm.values(), collections.Counter()),
                           "linked": sum((c for lib, c in llvm.items() if lib in linked),
                                         collections.Counter()),
                           "libraries": len(llvm),
                           "linked_libraries": len(linked & set(llvm))}}))
"""


READ_CHILD = r"""
import json, os, resource, sys, time
t_start = time.perf_counter()
import slide
from slide.kernels.parse import _parse_chunk
t_import = time.perf_counter() - t_start
path, how = sys.argv[1].rsplit(",", 1)
t0 = time.perf_counter()
X, Y = slide.read_xc(path, use_kernel=how != "numpy")
t_read = time.perf_counter() - t0
t0 = time.perf_counter()
slide.read_xc(path, use_kernel=how != "numpy")
print(json.dumps({"import_s": t_import, "read_s": t_read,
                  "again_s": time.perf_counter() - t0,
                  "compiled": len(_parse_chunk.signatures) > 0, "rows": int(X.shape[0]),
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "bytes": os.path.getsize(path)}))
"""


def measure(arg, cache_dir, helper="1", child=CHILD, root=ROOT):
    """``child`` (``CHILD``: its argument a configuration's JSON; ``FIRST_FIT_CHILD``: an XC
    file) in a fresh interpreter on the cache ``cache_dir``, with ``root``'s slide."""
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir, PYTHONPATH=root,
               SLIDE_COMPILE_HELPER=helper)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", child, arg], env=env, cwd=root,
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"measurement failed:\n{r.stderr}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["process_s"] = time.perf_counter() - t0
    return out


def commit(tree=ROOT):
    """The short commit of the checkout ``tree``."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree,
                              capture_output=True, text=True).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "compile_time.md"))
    ap.add_argument("--helper-rounds", type=int, default=0, help="cold warm-ups of slide's "
                    "defaults with the compile helper off and on, alternating (0: none)")
    ap.add_argument("--first-fit", metavar="FILE", help="measure a first read_xc and "
                    "SlideClassifier(random_state=0).fit of this XC file, cold then warm")
    ap.add_argument("--tree", default=ROOT, help="the checkout whose slide is measured "
                    "(default: this one)")
    ap.add_argument("--before", help="with --first-fit: a second checkout measured the same "
                    "way, alternating with --tree")
    ap.add_argument("--rounds", type=int, default=1, help="with --first-fit: cold and warm "
                    "runs of each checkout, alternating (default 1)")
    ap.add_argument("--warm-fits", type=int, default=0, help="with --first-fit: then this many "
                    "more warm fits of each checkout, alternating (default 0)")
    ap.add_argument("--rows", type=int, default=0, help="with --first-fit: fit on the file's "
                    "first this many rows (default 0: all)")
    ap.add_argument("--params", default="{}", help="with --first-fit: the estimator's "
                    "hyperparameters beside random_state=0, as JSON (default {}: the defaults)")
    ap.add_argument("--reads", nargs="+", metavar="FILE", help="measure read_xc alone on "
                    "these XC files: by NumPy, by the parser cold and by the parser warm")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.warm_fits < 0 or args.rows < 0:
        ap.error("--rounds must be at least 1, --warm-fits and --rows at least 0")
    if args.reads:
        lines = reads_report([os.path.abspath(p) for p in args.reads], args.rounds)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"wrote {args.out}")
        return
    if args.first_fit:
        trees = [os.path.abspath(args.tree)] + ([os.path.abspath(args.before)]
                                                if args.before else [])
        lines = first_fit_report(os.path.abspath(args.first_fit), trees, args.rounds,
                                 args.warm_fits, args.rows, json.loads(args.params))
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"wrote {args.out}")
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="slide-numba-cache-") as cache:
        # cold: slide then the dense baseline in one empty cache (as the quickstart runs them;
        # the dense run reuses the kernels they share, e.g. the optimizer's); then both warm
        for state in ("cold", "warm"):
            for name, params in CONFIGS.items():
                m = measure(json.dumps(params), cache)
                rows.append((state, name, m))
                print(f"{state:5s} {name:40s} compile {m['compile_s']:6.1f} s  "
                      f"({m['n_compiled']} kernels compiled)  first batch "
                      f"{m['first_batch_s']:.3f} s, median {m['median_batch_s']:.3f} s, new "
                      f"signatures in the fit: {m['new_signatures'] or 'none'}", flush=True)
    lines = ["# Kernel compilation time", "",
             f"`python bench/compile_time.py` at commit `{commit()}`, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores "
             f"({platform.processor() or platform.machine()}), run alone under an "
             f"exclusive lock.", "",
             "Each row is a fresh interpreter with `NUMBA_CACHE_DIR` at one temporary directory: "
             "*cold* = empty cache (first run after install: Numba compiles), *warm* = the "
             "machine code loaded from that cache (every later run). *compile* is "
             "`slide.warmup.warm_up` (the tiny throw-away fit that `SlideClassifier.fit` runs "
             "before its clock starts; `compile_seconds_`). Then a real fit (xc200k shape at "
             "scale 0.05: 10,000 labels, 3,000 points, batch 128, 2 threads) is timed: its "
             "first batch against the median batch, and the kernels' type signatures before "
             "and after it (none new = the warm-up compiled everything the fit used).", "",
             "| cache | configuration | compile (s) | kernels compiled | first batch (s) | "
             "median batch (s) | new signatures in the fit | interpreter start + import (s) |",
             "|---|---|---|---|---|---|---|---|"]
    for state, name, m in rows:
        lines.append(f"| {state} | {name} | {m['compile_s']:.1f} | {m['n_compiled']} | "
                     f"{m['first_batch_s']:.3f} | {m['median_batch_s']:.3f} | "
                     f"{len(m['new_signatures']) or 'none'} | {m['import_s']:.1f} |")
    cold = {name: m for state, name, m in rows if state == "cold"}
    lines += ["", "Kernels compiled cold, per configuration (the dense baseline's list omits "
              "those the slide run had already compiled into the cache):", ""]
    for name, m in cold.items():
        lines.append(f"- {name}: " + ", ".join(f"`{k}`" for k in m["compiled_kernels"]))
    lines += helper_rounds(args.helper_rounds)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


def _machine():
    """The machine in words: its CPU model, cores and BLAS kernels."""
    from bench.common import machine_description
    m = machine_description()
    return f"{m['cores']} cores ({m['cpu']}; BLAS {m['blas']})"


def first_fit_report(path, trees, rounds=1, warm_fits=0, n_rows=0, params=None):
    """A first run's read and fit of the XC file ``path`` (the fit on its first ``n_rows``
    rows; 0: all) with each checkout of ``trees``' slide, cold (empty cache) then warm,
    ``rounds`` times alternating between them, then ``warm_fits`` more warm fits of each, as
    report lines. ``params``: the estimator's hyperparameters beside ``random_state=0``."""
    params = dict(params or {})
    arg = json.dumps([path, int(n_rows), params])
    rows = {tree: [] for tree in trees}
    name = {tree: commit(tree) for tree in trees}
    caches = {tree: tempfile.mkdtemp(prefix="slide-numba-cache-") for tree in trees}
    try:
        for r in range(rounds):
            for tree in trees:
                shutil.rmtree(caches[tree])
                os.makedirs(caches[tree])
                for state in ("cold", "warm"):
                    m = measure(arg, caches[tree], child=FIRST_FIT_CHILD, root=tree)
                    rows[tree].append((state, m))
                    print(f"{name[tree]} {state:5s} read_xc {m['read_s']:6.1f} s  fit "
                          f"{m['fit_s']:6.1f} s (compile {m['compile_s']:.1f} s, train "
                          f"{m['train_s']:.1f} s)  whole process {m['process_s']:.1f} s, "
                          f"collector {m['gc_s']:.1f} s",
                          flush=True)
        for _ in range(warm_fits):
            for tree in trees:
                m = measure(arg, caches[tree], child=FIRST_FIT_CHILD, root=tree)
                rows[tree].append(("warm", m))
                print(f"{name[tree]} warm  network training {m['train_s']:.2f} s", flush=True)
    finally:
        for cache in caches.values():
            shutil.rmtree(cache, ignore_errors=True)
    m = rows[trees[0]][0][1]
    names = " and ".join(f"`{name[t]}`" for t in trees)
    shown = ", ".join(f"{k}={v!r}" for k, v in params.items())
    lines = [f"# A first run: reading a file and fitting `SlideClassifier("
             f"{shown + ', ' if shown else ''}random_state=0)`", "",
             f"`python bench/compile_time.py --first-fit {os.path.basename(path)} --rounds "
             f"{rounds} --warm-fits {warm_fits}{f' --rows {n_rows}' if n_rows else ''}"
             f"{f' --params {json.dumps(params)!r}' if params else ''}` at "
             f"commit `{commit()}`, measuring the slide "
             f"of commit{'s' if len(trees) > 1 else ''} {names}, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {_machine()}, run alone "
             f"under an exclusive lock. The fit: {m['rows']:,} rows"
             f"{' (the first of the file)' if n_rows else ''}, {m['labels']:,} labels.",
             "",
             "Each row is a fresh interpreter with `NUMBA_CACHE_DIR` at one temporary "
             "directory per checkout, emptied at each round: *cold* finds it empty (a new "
             "user's first run: every kernel compiles), *warm* loads what the cold run left "
             "there. *fit* is the whole `fit` call: its compile (`compile_seconds_`, the "
             "warm-up before the clock), training and the stages after the network. The "
             "checkouts alternate, round by round. *Collector*: the seconds this process "
             "spent inside Python's cyclic garbage collector (the helper's are not counted); "
             "*peak*: its peak resident memory.", "",
             "| slide of | cache | import (s) | `read_xc` (s) | `fit` (s) | of which compile (s) "
             "| of which network training (s) | whole process (s) | collector (s) | peak (MB) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for tree in trees:
        for state, m in rows[tree]:
            lines.append(f"| `{name[tree]}` | {state} | {m['import_s']:.1f} | "
                         f"{m['read_s']:.1f} | {m['fit_s']:.1f} | {m['compile_s']:.1f} | "
                         f"{m['train_s']:.2f} | {m['process_s']:.1f} | {m['gc_s']:.1f} | "
                         f"{m['peak_mb']:.0f} |")
    lines += ["", "| slide of | cold whole process (s), median | cold `read_xc` (s), median | "
              "warm network training (s), mean ± sd |", "|---|---|---|---|"]
    for tree in trees:
        cold = [m for state, m in rows[tree] if state == "cold"]
        warm = np.array([m["train_s"] for state, m in rows[tree] if state == "warm"])
        lines.append(f"| `{name[tree]}` | {np.median([m['process_s'] for m in cold]):.1f} | "
                     f"{np.median([m['read_s'] for m in cold]):.1f} | {warm.mean():.2f} ± "
                     f"{warm.std(ddof=1) if warm.size > 1 else 0.0:.2f} ({warm.size} fits) |")
    for tree in trees:
        lines += kernel_lines(rows[tree][0][1], name[tree])
    return lines


READ_WAYS = {"numpy": "NumPy (`use_kernel=False`)",
             "kernel-cold": "the parser, empty cache (its compile included)",
             "kernel-warm": "the parser, loaded from the cache"}


def reads_report(paths, rounds):
    """``read_xc`` of each file in ``paths`` the three ways of ``READ_WAYS``, each in a fresh
    interpreter, ``rounds`` times (a fresh empty cache each round), as report lines."""
    seconds = {(p, way): [] for p in paths for way in READ_WAYS}
    again = {(p, way): [] for p in paths for way in READ_WAYS}
    peak = {(p, way): [] for p in paths for way in READ_WAYS}
    info = {}
    for r in range(rounds):
        for path in paths:
            with tempfile.TemporaryDirectory(prefix="slide-numba-cache-") as cache:
                for way in READ_WAYS:      # in this order: the cold parser fills the cache
                    m = measure(f"{path},{way}", cache, child=READ_CHILD)
                    if m["compiled"] != (way != "numpy"):
                        raise SystemExit(f"{way} read of {path}: parser compiled = "
                                         f"{m['compiled']}")
                    seconds[path, way].append(m["read_s"])
                    again[path, way].append(m["again_s"])
                    peak[path, way].append(m["peak_mb"])
                    info[path] = m
                    print(f"round {r + 1} {os.path.basename(path)} {way:11s} "
                          f"{m['read_s']:6.2f} s", flush=True)
    names = " ".join(os.path.basename(p) for p in paths)
    lines = ["# Reading an XC file before and after the parser is compiled", "",
             f"`python bench/compile_time.py --reads {names} --rounds {rounds}` at commit "
             f"`{commit()}`, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {_machine()}, run alone "
             "under an exclusive lock.", "",
             "Each figure is a process's first `read_xc` call (not the interpreter's start or "
             "import), each way in a fresh interpreter; per round and file a fresh empty Numba "
             "cache, read by NumPy, then by the parser (compiling it), then by the parser in a "
             "new interpreter (loading it from the cache). *Again*: the same process's second "
             "call (nothing left to compile or load). *Peak*: the process's peak resident "
             "memory (its import included). Median of the rounds, with the range.", "",
             "| file | MB | rows | " + " | ".join(f"{w} (s)" for w in READ_WAYS.values())
             + " | NumPy again (s) | the parser again (s) | NumPy peak (MB) | the parser's "
             "peak, loaded (MB) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for path in paths:
        cells = [_median_range(seconds[path, w]) for w in READ_WAYS]
        cells += [_median_range(again[path, "numpy"]), _median_range(again[path, "kernel-warm"])]
        cells += [f"{np.median(peak[path, w]):.0f}" for w in ("numpy", "kernel-warm")]
        lines.append(f"| {os.path.basename(os.path.dirname(path))}/{os.path.basename(path)} | "
                     f"{info[path]['bytes'] / 1e6:.1f} | {info[path]['rows']:,} | "
                     + " | ".join(cells) + " |")
    return lines


def _median_range(values):
    """"median (min-max)" of seconds."""
    return f"{np.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def kernel_lines(cold, name, top=15):
    """Report lines: where the cold run ``cold`` of slide ``name`` spent its compile, kernel by
    kernel (this process only: the compile helper's kernels compile in the other one)."""
    kernels = cold.get("kernels", [])
    if not kernels:
        return []
    total = sum(s for _, _, s in kernels)
    lines = ["", f"Where the first cold run of `{name}` compiled, in this process (the compile "
             f"helper's kernels compile in the other): {total:.1f} s over {len(kernels)} "
             f"kernels; the {min(top, len(kernels))} largest, each kernel's own seconds (from "
             "its start to its end, less the kernels it compiled meanwhile: the callees its "
             "call sites compile first; a caller's own seconds include generating its "
             "callees' machine code again, as Numba links them into its own):", "",
             "| kernel | signatures | own seconds | share |", "|---|---|---|---|"]
    for k, n, s in kernels[:top]:
        lines.append(f"| `{k}` | {n} | {s:.2f} | {s / total:.0%} |")
    return lines + twice_lines(kernels) + llvm_lines(cold)


def twice_lines(kernels):
    """Report lines: the kernels of ``kernels`` ([name, compiles, seconds]) that compiled more
    than once in the process, each for another tuple of argument types (a literal, an
    integer's width, a dtype): where a cast at a call site could save a compile."""
    twice = sorted((k, n) for k, n, _ in kernels if n > 1)
    listed = ", ".join(f"`{k}` ({n})" for k, n in twice) if twice else "none"
    return ["", f"Kernels of this process compiled more than once (a signature each): {listed}."]


LLVM_PARTS = ("function passes", "module passes", "machine code")


def llvm_lines(cold):
    """Report lines: LLVM's seconds in the cold run ``cold`` (this process), all of its
    libraries and those linked into another library."""
    llvm = cold.get("llvm")
    if not llvm or not llvm["all"]:
        return []
    compile_s = cold["compile_s"]
    lines = ["", f"LLVM's part of that run's compile ({compile_s:.1f} s in this process): "
             "Numba's calls into LLVM's function passes, module passes and machine-code "
             f"generation, over its {llvm['libraries']} code libraries and over the "
             f"{llvm['linked_libraries']} of them linked into another library (a callee, a "
             "parallel loop's body and wrappers: optimised and generated for itself, then "
             "again inside its caller):", "",
             "| libraries | " + " | ".join(LLVM_PARTS) + " | LLVM in all | share of the "
             "compile |", "|---|---|---|---|---|---|"]
    for key, label in (("all", "all"), ("linked", "linked into another")):
        parts = [llvm[key].get(p, 0.0) for p in LLVM_PARTS]
        lines.append(f"| {label} | " + " | ".join(f"{v:.1f}" for v in parts)
                     + f" | {sum(parts):.1f} | {sum(parts) / compile_s:.0%} |")
    return lines


def helper_rounds(n):
    """Report lines of n cold warm-ups of slide's defaults without and with the helper."""
    if n <= 0:
        return []
    params = CONFIGS["slide (defaults: random sampler, vote, re-ranker)"]
    seconds = {"0": [], "1": []}
    for r in range(n):
        for helper in ("0", "1"):
            with tempfile.TemporaryDirectory(prefix="slide-numba-cache-") as cache:
                m = measure(json.dumps(params), cache, helper)
            seconds[helper].append(m["compile_s"])
            print(f"round {r + 1} helper {'on ' if helper == '1' else 'off'} compile "
                  f"{m['compile_s']:6.1f} s ({m['n_compiled']} kernels compiled here)",
                  flush=True)
    off, on = (sorted(seconds[h])[n // 2] for h in ("0", "1"))
    lines = ["", f"The compile helper, cold, slide's defaults ({n} rounds, off then on, each in "
             "a fresh empty cache; compile = the warm-up's seconds):", "",
             "| round | helper off (s) | helper on (s) |", "|---|---|---|"]
    lines += [f"| {r + 1} | {a:.1f} | {b:.1f} |" for r, (a, b) in
              enumerate(zip(seconds["0"], seconds["1"]))]
    lines += ["", f"Median: {off:.1f} s off, {on:.1f} s on ({on / off:.2f}x)."]
    return lines


if __name__ == "__main__":
    main()
