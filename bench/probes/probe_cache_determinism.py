"""Does a training run give the same bits whether Numba compiled its kernels in the process or
loaded them from its on-disk cache?

    python bench/probes/probe_cache_determinism.py [--cases default,batched] [--runs 2]

Trains the named cases of ``tests/make_golden.py`` (small fixed-seed fits of the engine) in
``--runs`` fresh processes that share one empty ``NUMBA_CACHE_DIR``: the first compiles every
kernel, the later ones load them. Prints each run's digests of W and of Adam's first moment
per case and exits 1 when the runs differ. In round 3 (nineteenth session) a fused catch-up
and Adam update gave one set of bits compiled and another cached (``docs/history.md``); the
golden tests alone did not see it, since they run with whatever the cache holds.
"""
import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = """
import sys
sys.path.insert(0, {tests!r})
import make_golden as mg
X, Y, Xt, _ = mg.data()
for name in {cases!r}:
    fp = mg.fingerprint(mg.train_case(name, X, Y), Xt)
    print(name, fp["W"]["sha256"][:16], fp["MW"]["sha256"][:16])
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="default,batched")
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    code = CHILD.format(tests=os.path.join(ROOT, "tests"), cases=cases)
    outputs = []
    with tempfile.TemporaryDirectory(prefix="slide-cache-") as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=ROOT)
        for run in range(max(2, args.runs)):
            out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, check=True,
                                 capture_output=True, text=True).stdout
            lines = [line for line in out.splitlines() if line.split()[:1] and
                     line.split()[0] in cases]
            state = "compiled" if run == 0 else "cached"
            for line in lines:
                print(f"run {run + 1} ({state}): {line}")
            outputs.append(lines)
    same = all(o == outputs[0] for o in outputs)
    print("the same bits in every run" if same else "RUNS DIFFER")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
