"""Input scale: every input value multiplied by xscale (train and test) -- with Adam, about a
xscale-times larger step for the first layer's effect on the hidden units; also plain
hyperparameter runs.

    python bench/probes/probe_x.py debdeps '{"xscale": 3}' '{"hidden_sizes": [512]}'
"""
import sys, json
import numpy as np
from slide import SlideClassifier, metrics
from slide.data import read_xc
ds = sys.argv[1]; runs = [json.loads(r) for r in sys.argv[2:]]
root = {"debtags": "/work/shared/data/debtags", "debdeps": "/work/data/debdeps"}[ds]
Xtr, Ytr = read_xc(root + "/train.txt"); Xte, Yte = read_xc(root + "/test.txt")
inv = metrics.inverse_propensity(Ytr)
for p in runs:
    p = dict(p); c = p.pop("xscale", 1.0); seeds = p.pop("seeds", [0])
    A, B = Xtr.copy(), Xte.copy(); A.data *= c; B.data *= c
    for seed in seeds:
        m = SlideClassifier(**p, n_threads=2, random_state=seed).fit(A, Ytr)
        e = metrics.evaluate(Yte, m.predict_topk(B, k=5), ks=(1,5), inv_propensity=inv)
        print(f"{ds} xscale={c} {p} seed {seed} P@1 {e['P@1']:.4f} P@5 {e['P@5']:.4f} PSP@5 {e['PSP@5']:.4f} train_s {m.train_seconds_:.1f}", flush=True)
