"""Probe (one question, then removed; git keeps it): what do the row steps' inlined helpers
cost and buy? ``_first_row`` and ``_output_row_step`` are ``inline="always"`` into
``batch_row_steps``; without it, how much shorter is a cold warm-up of slide's defaults, and how
much slower a batch?

Two copies of the repository in temporary directories, one as it is (inlined), one with the
two decorators' ``inline="always"`` removed. For each: a cold warm-up (empty Numba cache, the
compile helper off) of ``SlideClassifier()`` on a small xc200k set, then rounds alternating the
two copies of a network-only fit (``neighbours=0, rerank=False``) on debcontents (3 epochs) and
on xc200k (20,000 rows, 1 epoch), their ``train_seconds_``.

    flock /tmp/slide-cpu.lock python bench/probe_row_step_inlining.py --rounds 3 \\
        --out bench/results/row_step_inlining.md
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.common import git_commit, machine_description  # noqa: E402

HELPERS = ("def _output_row_step(", "def _first_row(")

COMPILE = r"""
import json, os, time
import slide
X, Y, _, _ = slide.generate("xc200k", scale=0.05, n_train=3000, n_test=10, seed=0)
m = slide.SlideClassifier(random_state=0, n_threads=2)
m._checked_params()
t = time.perf_counter()
m._warm_up(X, Y)
print(json.dumps({"warm_up_s": time.perf_counter() - t}))
"""

FIT = r"""
import json, sys
import slide
from slide.data import read_xc
Xc, Yc = read_xc(sys.argv[1])[:2]
Xs, Ys, _, _ = slide.generate("xc200k", n_train=20000, n_test=10, seed=0)
kw = dict(random_state=0, neighbours=0, rerank=False, n_threads=2)
slide.SlideClassifier(**kw, epochs=1).fit(Xc[:2000], Yc[:2000])
out = {}
for name, X, Y, ep in (("debcontents", Xc, Yc, 3), ("xc200k", Xs, Ys, 1)):
    out[name] = slide.SlideClassifier(**kw, epochs=ep).fit(X, Y).train_seconds_
print(json.dumps(out))
"""


def copy_repo(dst, inline):
    shutil.copytree(ROOT, dst, ignore=shutil.ignore_patterns(
        ".git", "__pycache__", "datasets", "runs", "bench"))
    if not inline:
        path = os.path.join(dst, "slide", "network", "row_steps.py")
        lines = open(path).read().split("\n")
        for i, line in enumerate(lines):
            if any(line.startswith(h) for h in HELPERS):
                assert 'inline="always"' in lines[i - 1], lines[i - 1]
                lines[i - 1] = lines[i - 1].replace(', inline="always"', "")
        open(path, "w").write("\n".join(lines))


def run(code, repo, cache, *args):
    env = dict(os.environ, PYTHONPATH=repo, NUMBA_CACHE_DIR=cache, SLIDE_COMPILE_HELPER="0")
    env.pop("OPENBLAS_CORETYPE", None)
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=repo, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data", default=os.path.join(ROOT, "datasets/debcontents/train.txt"))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="slide-inline-")
    variants = {"inlined (as built)": True, "not inlined": False}
    repos, caches, compiles = {}, {}, {}
    for name, inline in variants.items():
        repos[name] = os.path.join(tmp, "inline" if inline else "call")
        caches[name] = repos[name] + "-cache"
        copy_repo(repos[name], inline)
        compiles[name] = run(COMPILE, repos[name], caches[name])["warm_up_s"]
        print(name, "cold warm-up", round(compiles[name], 1), flush=True)
    fits = {name: [] for name in variants}
    for r in range(args.rounds):
        for name in variants:
            fits[name].append(run(FIT, repos[name], caches[name], args.data))
            print(name, "round", r, fits[name][-1], flush=True)
    lines = ["# Row steps: inlined helpers against calls", "",
             f"`bench/probe_row_step_inlining.py` at `{git_commit()}`; {machine_description()}; "
             "2 threads.", "",
             "| row-step helpers | cold warm-up of `SlideClassifier()` s | debcontents network, "
             "3 epochs, s (each round) | xc200k network, 1 epoch, s (each round) |",
             "|---|---|---|---|"]
    for name in variants:
        dc = " / ".join(f"{f['debcontents']:.2f}" for f in fits[name])
        xc = " / ".join(f"{f['xc200k']:.2f}" for f in fits[name])
        lines.append(f"| {name} | {compiles[name]:.1f} | {dc} | {xc} |")
    open(args.out, "w").write("\n".join(lines) + "\n")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
