"""Write a synthetic benchmark data set to disk (XC format), frozen for every later run.

    python bench/make_data.py xc200k datasets/bench-xc200k --n-test 10000
    python bench/make_data.py amazon670k datasets/bench-amazon670k --n-train 40000 --n-test 10000

``compare.py --data DIR`` then reads ``DIR/train.txt`` and ``DIR/test.txt``: files, unlike a
preset name, do not change when the generator is retuned, so cached baseline results stay
valid for a later slide-only rerun (``--reuse``). ``DIR/source.json`` records the generator's
parameters, seed and the commit it was generated at.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("preset")
    p.add_argument("out_dir")
    p.add_argument("--n-train", type=int, default=None)
    p.add_argument("--n-test", type=int, default=None)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="generator parameter override, e.g. --set label_alpha=1.0")
    a = p.parse_args(argv)
    from slide.synthetic import generate, preset_params, write_dataset
    over = {k: v for k, v in (("n_train", a.n_train), ("n_test", a.n_test)) if v is not None}
    for item in a.set:
        key, sep, value = item.partition("=")
        if not sep:
            p.error(f"--set needs KEY=VALUE, got {item!r}")
        over[key] = float(value) if "." in value or "e" in value else int(value)
    t = time.perf_counter()
    parts = generate(a.preset, scale=a.scale, seed=a.seed, **over)
    write_dataset(a.out_dir, *parts)
    info = {"preset": a.preset, "scale": a.scale, "seed": a.seed, "overrides": over,
            "params": preset_params(a.preset, a.scale, **over), "commit": common.git_commit(),
            "synthetic_py_sha1": common._file_digest(common.REPO / "slide" / "synthetic.py"),
            "shapes": {n: list(M.shape) for n, M in zip(("X_train", "Y_train", "X_test",
                                                         "Y_test"), parts)},
            "seconds": round(time.perf_counter() - t, 1)}
    (Path(a.out_dir) / "source.json").write_text(json.dumps(info, indent=1, default=str))
    print(json.dumps(info, default=str))


if __name__ == "__main__":
    main()
