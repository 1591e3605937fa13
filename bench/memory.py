"""Peak resident memory of a ``SlideClassifier`` fit, and of predicting after it, in one process.

The process's peak (``ru_maxrss``) read at three points: after generating the data, after
``fit`` (the network, the neighbour memory and the re-ranker at the defaults) and after
``predict_topk`` on the test rows. A peak only grows, so each figure is the largest resident
size up to that point: the fit's is what training needs, data included; the prediction's adds
its blocks of scores. Run it warm (a second time, or after ``slide compile``): a first run also
holds the compiler's memory.

    python bench/memory.py --preset amazon670k --n-test 2000 --out bench/results/memory_amazon670k
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import git_commit, machine_description  # noqa: E402

GIB = 2 ** 30


def peak_bytes():
    """The process's peak resident size so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="amazon670k", help="slide.synthetic preset")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--n-train", type=int, default=None, help="training rows (preset's: all)")
    ap.add_argument("--n-test", type=int, default=2000)
    ap.add_argument("--param", action="append", default=[],
                    help="KEY=JSON SlideClassifier parameter (repeatable)")
    ap.add_argument("--out", default=None, help="path prefix of .json/.md")
    args = ap.parse_args(argv)
    import slide
    params = dict(n_threads=2, learning_rate=1e-3, epochs=1, random_state=0)
    for item in args.param:
        key, _, value = item.partition("=")
        params[key] = json.loads(value)
    overrides = {"n_test": args.n_test}
    if args.n_train is not None:
        overrides["n_train"] = args.n_train
    X, Y, Xt, _ = slide.generate(args.preset, scale=args.scale, seed=0, **overrides)
    row = {"after_data": peak_bytes()}
    model = slide.SlideClassifier(**params)
    t = time.perf_counter()
    model.fit(X, Y)
    row["fit_seconds"] = time.perf_counter() - t
    row["after_fit"] = peak_bytes()
    model.predict_topk(Xt, k=5)
    row["after_predict"] = peak_bytes()
    result = {"command": "python bench/memory.py " + " ".join(argv if argv is not None
                                                             else sys.argv[1:]),
              "commit": git_commit(), "machine": machine_description(),
              "preset": args.preset, "rows": X.shape[0],
              "labels": Y.shape[1], "params": params,
              "batches_in_flight": model.batches_in_flight,
              "compile_seconds": model.compile_seconds_, **row}
    lines = [f"# Peak memory: {args.preset}, {X.shape[0]} rows, {Y.shape[1]} labels",
             "", f"- command: `{result['command']}`", f"- commit {result['commit']}; machine: "
             f"{result['machine']}", f"- parameters: {params}", "",
             "| point | peak RSS, GiB | GB |", "|---|---|---|"]
    for key in ("after_data", "after_fit", "after_predict"):
        lines.append(f"| {key.replace('_', ' ')} | {row[key] / GIB:.3f} | "
                     f"{row[key] / 1e9:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out + ".json", "w") as f:
            json.dump(result, f, indent=1)
        with open(args.out + ".md", "w") as f:
            f.write(text)
    return result


if __name__ == "__main__":
    main()
