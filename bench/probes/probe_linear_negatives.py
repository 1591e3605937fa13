"""The linear classifiers' two sources of hard negatives compared on one trained network:
``SlideClassifier()`` is fitted once per seed, then its stages after the network are refitted
with the negatives from the network's top labels (``hard_negatives``, forced) and from the
neighbours' votes (``neighbour_negatives``, what the fit chooses where labels outnumber the
used rows), each twice, and the test rows predicted: a paired comparison (the network's
seed-to-seed spread is out of it). Printed per refit: the stages' seconds, the linear
classifiers' seconds, P@1, P@5, PSP@5.

    python bench/probes/probe_linear_negatives.py --train datasets/debcontents/train.txt \\
        --test datasets/debcontents/test.txt --seeds 0,1,2
    python bench/probes/probe_linear_negatives.py --preset xc200k --n-train 100000 --seeds 0
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train")
    ap.add_argument("--test")
    ap.add_argument("--preset", help="a synthetic preset instead of --train/--test")
    ap.add_argument("--n-train", type=int, default=100000)
    ap.add_argument("--n-test", type=int, default=5000)
    ap.add_argument("--seeds", default="0")
    args = ap.parse_args()
    import slide
    from bench.common import git_commit
    from slide.rank import linear as label_linear
    from slide.rank import rerank
    if args.preset:
        X, Y, Xt, Yt = slide.synthetic.generate(args.preset, seed=0, n_train=args.n_train,
                                                n_test=args.n_test)
        name = f"{args.preset} ({args.n_train} rows)"
    else:
        X, Y = slide.read_xc(args.train)
        Xt, Yt = slide.read_xc(args.test)
        name = args.train
    Yt = Yt.tocsr()
    inv_p = slide.metrics.inverse_propensity(Y, 0.55, 1.5)
    real_choice, real_fit = label_linear.negatives_by_neighbours, label_linear.fit_classifiers
    seconds = {}

    def timed_fit(*a, **kw):
        t = time.perf_counter()
        out = real_fit(*a, **kw)
        seconds["linear"] = time.perf_counter() - t
        return out
    rerank.fit_classifiers = timed_fit
    print(f"commit {git_commit()}; {name}: {X.shape[0]} rows, {Y.shape[1]} labels; test "
          f"{Xt.shape[0]} rows\n")
    print("| seed | negatives | stages s | linear classifiers s | P@1 | P@5 | PSP@5 |")
    print("|---|---|---|---|---|---|---|", flush=True)
    for seed in [int(s) for s in args.seeds.split(",")]:
        model = slide.SlideClassifier(random_state=seed, n_threads=2).fit(X, Y)
        Xc, Yc, _ = model._check_training_data(X, Y, True, None)
        split = model._rerank_split(Xc.shape[0], Yc.shape[1])
        for label, choice in [("network's top labels", lambda *a: False),
                              ("neighbours' votes", real_choice)] * 2:
            label_linear.negatives_by_neighbours = choice
            try:
                t = time.perf_counter()
                model._build_memory(Xc, Yc, split)
                stage_s = time.perf_counter() - t
            finally:
                label_linear.negatives_by_neighbours = real_choice
            ev = slide.metrics.evaluate(Yt, model.predict_topk(Xt, k=5), ks=(1, 5),
                                        inv_propensity=inv_p)
            print(f"| {seed} | {label} | {stage_s:.1f} | {seconds['linear']:.1f} | "
                  f"{ev['P@1']:.4f} | {ev['P@5']:.4f} | {ev['PSP@5']:.4f} |", flush=True)


if __name__ == "__main__":
    main()
