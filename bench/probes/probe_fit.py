"""Overfitting check: P@1 on the first 5,000 training rows against P@1 on the test set after a
SlideClassifier() fit.

    python bench/probes/probe_fit.py debtags,debdeps
"""
import sys, json
import numpy as np
from slide import SlideClassifier, metrics
from slide.data import read_xc
for ds in sys.argv[1].split(","):
    p = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    root = {"debtags": "/work/shared/data/debtags", "debdeps": "/work/data/debdeps"}[ds]
    Xtr, Ytr = read_xc(root + "/train.txt"); Xte, Yte = read_xc(root + "/test.txt")
    m = SlideClassifier(**p, n_threads=2, random_state=0)
    def cb(model, info):
        if info["batch_in_epoch"] == 0 or info["batch_in_epoch"] == -(-Xtr.shape[0] // 128) - 1:
            pass
    m.fit(Xtr, Ytr)
    tr = m.score(Xtr[:5000], Ytr[:5000]); te = m.score(Xte, Yte)
    print(f"{ds} {p} train P@1 (5000 rows) {tr:.4f} test P@1 {te:.4f} train_s {m.train_seconds_:.1f}", flush=True)
