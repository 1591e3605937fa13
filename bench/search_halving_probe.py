"""Probe: does a trial's held-out P@5 part-way through its schedule rank the learning-rate
trials as they rank at the end? (the question behind successive halving in ``SlideSearch``).

Trains the four trials of the default search fused, as ``SlideSearch.fit`` does, and scores
every trial's network on the search's held-out rows when the pass reaches each fraction of its
schedule. Prints one JSON line per (data set, seed).

    python bench/search_halving_probe.py --train T --test T --name debdeps --seeds 0,1,2
"""
import argparse
import json
import time

import numpy as np
from sklearn.base import clone


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rates", default="0.003,0.01,0.02,0.04")
    ap.add_argument("--fractions", default="0.125,0.25,0.375,0.5,0.75,1.0")
    args = ap.parse_args()
    from slide import SlideClassifier, SlideSearch
    from slide import fused as fused_mod
    from slide import labels as labels_mod
    from slide.data import cap_row_labels, read_xc
    from slide.labels import encode
    from slide.network import trainer
    X0, Y0 = read_xc(args.train)
    rates = [float(r) for r in args.rates.split(",")]
    fractions = [float(f) for f in args.fractions.split(",")]
    for seed in [int(s) for s in args.seeds.split(",")]:
        template = SlideClassifier(n_threads=args.threads, random_state=seed)
        search = SlideSearch(template, {"learning_rate": rates})
        Y, names = encode(Y0, name="Y")
        models = [clone(template).set_params(learning_rate=r, batches_in_flight=1)
                  for r in rates]
        fused_mod.warm_up_members(models, X0, Y, args.threads)
        X, Y, names = models[0]._check_training_data(X0, Y, False, names)
        Y = cap_row_labels(Y, models[0].max_row_labels, seed)
        for m in models:
            hs, sparse = m._checked_params()
            m._build(X.shape[1], Y.shape[1], hs, sparse)
            labels_mod.set_classes(m, names)
        fit_rows, held, _ = search._split(models[0], X.shape[0], Y.shape[1], seed)
        total = trainer.resolve_epochs(models[0].epochs, X.shape[0], 128) * \
            -(-fit_rows.shape[0] // 128)
        marks = [max(1, int(round(f * total))) for f in fractions]
        scores = {}
        score_seconds = []

        def callback(k, member, info):
            if k != len(models) - 1:
                return False
            due = [mk for mk in marks if mk <= member.batches_ and mk not in scores]
            if due:
                t0 = time.perf_counter()
                for m in models:
                    m.sync()
                scores[due[-1]] = [float(s) for s in SlideSearch._held_out_scores(
                    models, X, Y, held)]
                for mk in due[:-1]:
                    scores[mk] = None
                score_seconds.append(time.perf_counter() - t0)
            return False

        seconds = fused_mod.train_members(models, X, Y, fit_rows, seed, args.threads,
                                          callback=callback)
        print(json.dumps({"data": args.name, "seed": seed, "rates": rates,
                          "total_batches": total, "held_out": int(held.shape[0]),
                          "train_seconds": seconds, "score_seconds_each": score_seconds,
                          "scores": {str(k): v for k, v in sorted(scores.items())}}),
              flush=True)


if __name__ == "__main__":
    main()
