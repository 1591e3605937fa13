"""Probe (round 4): smaller or fewer-epoch networks, and ensembles of them, all predicting with
the neighbour vote, on a real set.

    python bench/probes/probe_members_vote.py debdeps|debtags JSON [JSON ...]

Each JSON holds SlideClassifier keywords, plus "n_models" for a SlideEnsemble of that many
members. One line per run: training seconds, P@1 and P@5 on every test point.
"""
import glob
import json
import sys

from slide import SlideClassifier, SlideEnsemble, metrics
from slide.data import read_xc

PATHS = {"debdeps": "/work/data/debdeps", "debtags": "/work/shared/data/debtags"}


def main(name, specs):
    base = PATHS[name]
    Xtr, Ytr = read_xc(glob.glob(base + "/train*")[0])
    Xte, Yte = read_xc(glob.glob(base + "/test*")[0])
    for spec in specs:
        n = spec.pop("n_models", 1)
        if n == 1:
            m = SlideClassifier(n_threads=2, random_state=0, **spec).fit(Xtr, Ytr)
        else:
            m = SlideEnsemble(SlideClassifier(n_threads=2, **spec), n_models=n,
                              random_state=0).fit(Xtr, Ytr)
        p = metrics.evaluate(Yte, m.predict_topk(Xte, k=5), ks=(1, 5))
        print(name, spec, "n_models", n, "train s", round(m.train_seconds_, 1),
              "P@1", round(p["P@1"], 4), "P@5", round(p["P@5"], 4), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], [json.loads(a) for a in sys.argv[2:]])
