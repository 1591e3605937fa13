"""Same-run speed comparison of two commits of the engine (A/B), e.g. before and after a
restructure:

    python bench/speed_ab.py --base 3adfde3 --head HEAD --shapes xc200k,amazon670k --repeat 3

Each commit is checked out into a temporary git worktree; the data of each shape are generated
once by this process and handed to every child through a temporary .npz file. The children run
alternately (A B A B ...), each in a fresh process with the commit's tree first on
``sys.path``: a throw-away fit on a small slice compiles (or loads) the kernels first, then one
timed ``fit`` of ``--n-train`` points with engine defaults (learning rate 1e-3, 2 threads).
Reported: the fastest and the median training seconds per commit and the ratio head / base
(< 1: head is faster). ``--mode network``: today's defaults, the network alone (the engine as
``compare.py`` runs it against TF sampled) instead of the LSH path with every stage. Results
go to ``bench/results/speed_ab.md`` and ``.json``.

``--env-base`` / ``--env-head`` (``KEY=VALUE,...``) set environment variables of one side's
children (the same commit on both sides then compares settings, e.g. Numba's threading layer);
``--busy N`` runs N single-threaded busy loops beside every timed child, as another user's
job on a shared machine would:

    python bench/speed_ab.py --base HEAD --head HEAD --env-base NUMBA_THREADING_LAYER=omp \
        --env-head NUMBA_THREADING_LAYER=tbb --busy 1 --mode network
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from bench.common import busy_loops  # noqa: E402

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np, scipy.sparse as sp
import slide
z = np.load(sys.argv[2])
def csr(n):
    return sp.csr_matrix((z[n + "_data"], z[n + "_indices"], z[n + "_indptr"]),
                         shape=tuple(z[n + "_shape"]))
X, Y = csr("X"), csr("Y")
epochs = int(sys.argv[4])
if sys.argv[3] == "network":
    # today's default engine, the network alone (as compare.py runs it against TF sampled)
    kw = dict(learning_rate=1e-3, lr_schedule="constant", epochs=epochs, n_threads=2,
              random_state=0, neighbours=0, rerank=False)
elif sys.argv[3] == "defaults":
    # SlideClassifier() as a user runs it: every stage, every default
    kw = dict(n_threads=2, random_state=0)
else:
    # the engine path both commits share (LSH + shared negatives)
    kw = dict(sampler="vanilla", learning_rate=1e-3, batch_size=128, epochs=epochs,
              n_threads=2, random_state=0)
warm = slide.SlideClassifier(**dict(kw, epochs=1))
warm.fit(X[:2048], Y[:2048])                   # compile / load the kernels: not timed
m = slide.SlideClassifier(**kw)
t0 = time.perf_counter()
m.fit(X, Y)
wall = time.perf_counter() - t0
import numba
try:
    from slide.kernels.codegen import vector_width
    width = vector_width()
except ImportError:         # a commit before slide chose the vectors' width: LLVM's (256)
    width = None
print(json.dumps({"file": slide.__file__, "train_seconds": m.train_seconds_,
                  "fit_wall_seconds": wall, "layer": numba.threading_layer(),
                  "vector_width": width}))
"""


MODES = {"vanilla": "one epoch of sampler vanilla, every stage of SlideClassifier (lr 1e-3, "
                    "batch 128)",
         "network": "one epoch of today's defaults, the network alone (neighbours=0, "
                    "rerank=False; lr 1e-3 constant)",
         "defaults": "SlideClassifier() with every stage and today's defaults"}


CLOCKS = {"train": "the training seconds (train_seconds_)",
          "fit": "the wall time of the whole fit() (model building included)"}


def _save(path, X, Y):
    np.savez(path, **{f"{n}_{k}": getattr(M, k) for n, M in (("X", X), ("Y", Y))
                      for k in ("data", "indices", "indptr")},
             X_shape=np.array(X.shape), Y_shape=np.array(Y.shape))


def _env(spec):
    """``KEY=VALUE,...`` as a dict."""
    return dict(kv.split("=", 1) for kv in spec.split(",") if kv)


def _worktree(ref, tmp, side):
    sha = subprocess.check_output(["git", "-C", ROOT, "rev-parse", "--short", ref],
                                  text=True).strip()
    path = os.path.join(tmp, f"{side}-{sha}")       # base and head may be one commit
    subprocess.check_call(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", path, sha])
    return sha, path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True)
    ap.add_argument("--head", default="HEAD")
    ap.add_argument("--shapes", default="xc200k,amazon670k",
                    help="comma list of synthetic presets (--n-train rows) or data set "
                    "folders (datasets/NAME: all of its train.txt)")
    ap.add_argument("--n-train", type=int, default=25_600)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--mode", choices=tuple(MODES), default="vanilla",
                    help="vanilla: the LSH engine path with every stage of SlideClassifier; "
                    "network: today's defaults, the network alone (no vote, no re-ranker); "
                    "defaults: SlideClassifier() with every stage")
    ap.add_argument("--clock", choices=("train", "fit"), default="train",
                    help="train: the model's train_seconds_ (the batches); fit: the whole "
                    "fit() call's wall time (building the model -- weight init, optimizer "
                    "buffers -- included)")
    ap.add_argument("--epochs", type=int, default=1, help="epochs of the timed fit (the "
                    "network and vanilla modes; longer runs average a noisy host out)")
    ap.add_argument("--env-base", default="", help="KEY=VALUE,... for the base's children")
    ap.add_argument("--env-head", default="", help="KEY=VALUE,... for the head's children")
    ap.add_argument("--busy", type=int, default=0,
                    help="single-threaded busy loops running beside every timed child")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "speed_ab"))
    args = ap.parse_args()
    envs = [_env(args.env_base), _env(args.env_head)]
    import slide
    tmp = tempfile.mkdtemp(prefix="slide-ab-")
    trees = [_worktree(args.base, tmp, "base"), _worktree(args.head, tmp, "head")]
    rows = []
    try:
        for shape in args.shapes.split(","):
            if os.path.isdir(shape):
                # a data set folder (datasets/NAME: its train.txt, every row)
                X, Y = slide.read_xc(os.path.join(shape, "train.txt"))
            else:
                X, Y, _, _ = slide.generate(shape, seed=0, n_train=args.n_train, n_test=10)
            data = os.path.join(tmp, f"{os.path.basename(shape.rstrip('/'))}.npz")
            _save(data, X, Y)
            times = [[], []]
            layers = [set(), set()]
            widths = [set(), set()]
            for r in range(args.repeat):
                for side in ((0, 1) if r % 2 == 0 else (1, 0)):
                    sha, path = trees[side]
                    with busy_loops(args.busy):
                        out = subprocess.run([sys.executable, "-c", CHILD, path, data,
                                              args.mode, str(args.epochs)],
                                             capture_output=True, text=True,
                                             check=True, env={**os.environ, **envs[side]})
                    rec = json.loads(out.stdout.strip().splitlines()[-1])
                    assert rec["file"].startswith(path), rec["file"]
                    sec = rec["train_seconds" if args.clock == "train" else "fit_wall_seconds"]
                    times[side].append(sec)
                    layers[side].add(rec["layer"])
                    widths[side].add(rec.get("vector_width"))
                    print(shape, sha, envs[side], rec["layer"], rec.get("vector_width"),
                          f"{sec:.2f} s", flush=True)
            (a, _), (b, _) = trees
            rows.append({"shape": shape, "labels": Y.shape[1], "n_train": X.shape[0],
                         "base": a, "head": b, "base_env": envs[0], "head_env": envs[1],
                         "busy": args.busy, "threading_layers": [sorted(x) for x in layers],
                         "vector_widths": [sorted(x, key=str) for x in widths],
                         "base_seconds": times[0],
                         "head_seconds": times[1],
                         "ratio_min": min(times[1]) / min(times[0]),
                         "ratio_median": statistics.median(times[1])
                         / statistics.median(times[0])})
    finally:
        for _, path in trees:
            subprocess.call(["git", "-C", ROOT, "worktree", "remove", "--force", path])
    with open(args.out + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    sides = [f"{trees[0][0]}{' ' + args.env_base if args.env_base else ''}",
             f"{trees[1][0]}{' ' + args.env_head if args.env_head else ''}"]
    extra = "".join(f" --{k.replace('_', '-')} {v}" for k, v in
                    (("env_base", args.env_base), ("env_head", args.env_head),
                     ("busy", args.busy), ("epochs", args.epochs if args.epochs != 1 else 0))
                    if v)
    busy = (f"; {args.busy} single-threaded busy loop(s) beside every timed run"
            if args.busy else "")
    mode_text = MODES[args.mode] if args.epochs == 1 else \
        MODES[args.mode].replace("one epoch", f"{args.epochs} epochs")
    lines = [f"# Engine speed, {sides[0]} (base) against {sides[1]} (head)", "",
             f"`python bench/speed_ab.py --base {args.base} --head {args.head} --shapes "
             f"{args.shapes} --n-train {args.n_train} --repeat {args.repeat} --mode "
             f"{args.mode} --clock {args.clock}{extra}`; {CLOCKS[args.clock]}: "
             f"{mode_text}, 2 threads{busy}; "
             f"kernels compiled before the clock, runs alternated A/B in fresh processes on "
             f"one machine.", "",
             "| shape | labels | points | base s (all runs) | head s (all runs) | head / base "
             "(fastest) | head / base (median) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['labels']:,} | {r['n_train']:,} | "
                     f"{', '.join(f'{t:.2f}' for t in r['base_seconds'])} | "
                     f"{', '.join(f'{t:.2f}' for t in r['head_seconds'])} | "
                     f"{r['ratio_min']:.3f} | {r['ratio_median']:.3f} |")
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
