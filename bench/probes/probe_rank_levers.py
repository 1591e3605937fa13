"""The ranking stages' settings compared on one trained network: ``SlideClassifier()`` is
fitted once, then its stages after the network (linear classifiers, re-ranker, neighbour
memory: ``_build_memory`` on the same held-out split) are refitted once per setting and the
test rows predicted, so every setting sees the same network (a paired comparison: HOGWILD's
run-to-run spread of the network, ~0.002-0.005 P@1 between seeds, is out of it). Printed per
refit: the stages' seconds (their share of ``train_seconds_``), P@1 and P@5. The unchanged
setting runs first and again last (the refits' own spread).

    python bench/probes/probe_rank_levers.py --train datasets/debcontents/train.txt \
        --test datasets/debcontents/test.txt [--seed 0] \
        --set linear.MAX_WORK=1e9 --set linear.MAX_WORK=5e8

``--set module.NAME=value``: a module-level setting of ``slide.rank.<module>`` for one refit
(several, comma-separated, for one refit together: ``--set linear.EPOCHS=10,rerank._C=10``).
"""
import argparse
import importlib
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def parse_setting(text):
    """[(module, name, value)] of one ``--set`` argument."""
    out = []
    for part in text.split(","):
        key, value = part.split("=")
        mod_name, name = key.strip().split(".")
        mod = importlib.import_module(f"slide.rank.{mod_name}")
        old = getattr(mod, name)
        out.append((mod, name, type(old)(float(value)) if isinstance(old, (int, float))
                    else value))
    return out


def refit(model, X, Y, split, Xt, Yt, label, setting):
    olds = [(mod, name, getattr(mod, name)) for mod, name, _ in setting]
    for mod, name, value in setting:
        setattr(mod, name, value)
    try:
        t = time.perf_counter()
        model._build_memory(X, Y, split)
        stage_s = time.perf_counter() - t
        top = model.predict_topk(Xt, k=5)
    finally:
        for mod, name, value in olds:
            setattr(mod, name, value)
    hit = np.array([np.isin(top[i], Yt.indices[Yt.indptr[i]:Yt.indptr[i + 1]])
                    for i in range(Xt.shape[0])])
    print(f"| {label} | {stage_s:.1f} | {hit[:, 0].mean():.4f} | {hit.mean():.4f} |", flush=True)


def fitted(train, test, seed):
    """``SlideClassifier()`` fitted on the XC file ``train`` (2 threads, ``seed``): (model, its
    checked X and Y, its re-ranker's split, the test rows X and Y); prints the header of the
    refits' table."""
    import slide
    from bench.common import git_commit
    X, Y = slide.read_xc(train)
    Xt, Yt = slide.read_xc(test)
    model = slide.SlideClassifier(random_state=seed, n_threads=2).fit(X, Y)
    print(f"commit {git_commit()}; {train}: {X.shape[0]} rows, {Y.shape[1]} labels; test "
          f"{Xt.shape[0]} rows; seed {seed}; the fit's train_seconds_ "
          f"{model.train_seconds_:.1f}", flush=True)
    Xc, Yc, _ = model._check_training_data(X, Y, True, None)
    split = model._rerank_split(Xc.shape[0], Yc.shape[1])
    print("| setting | ranking stages s | P@1 | P@5 |\n|---|---|---|---|", flush=True)
    return model, Xc, Yc, split, Xt, Yt.tocsr()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], dest="settings")
    args = ap.parse_args()
    model, Xc, Yc, split, Xt, Yt = fitted(args.train, args.test, args.seed)
    refit(model, Xc, Yc, split, Xt, Yt, "defaults", [])
    for text in args.settings:
        refit(model, Xc, Yc, split, Xt, Yt, text, parse_setting(text))
    refit(model, Xc, Yc, split, Xt, Yt, "defaults, again", [])


if __name__ == "__main__":
    main()
