"""Decoupled weight decay emulated by a fit callback: after every batch every weight (not the
biases) of the chosen layers is scaled by 1 - lr_t * wd (a dense pass; a probe, not an
implementation).

    python bench/probes/probe_wd.py debtags 0,0.03,0.1,0.3,1.0
"""
import sys, json
import numpy as np
from slide import SlideClassifier, metrics
from slide.data import read_xc
ds = sys.argv[1]; wds = [float(x) for x in sys.argv[2].split(",")]; params = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
layers = sys.argv[4] if len(sys.argv) > 4 else "all"
root = {"debtags": "/work/shared/data/debtags", "debdeps": "/work/data/debdeps"}[ds]
Xtr, Ytr = read_xc(root + "/train.txt"); Xte, Yte = read_xc(root + "/test.txt")
inv = metrics.inverse_propensity(Ytr)
for wd in wds:
  for seed in (0,):
    m = SlideClassifier(**params, n_threads=2, random_state=seed)
    def cb(model, info):
        if wd > 0:
            lay = model.network_.layout; W = model.network_.W
            f = np.float32(1.0 - model.optimizer_.learning_rate * wd)
            ls = range(lay.n_layers) if layers == "all" else [int(x) for x in layers.split(",")]
            for l in ls:
                W[int(lay.w_off[l]):int(lay.w_off[l + 1])] *= f
    m.fit(Xtr, Ytr, callback=cb)
    e = metrics.evaluate(Yte, m.predict_topk(Xte, k=5), ks=(1,5), inv_propensity=inv)
    print(f"{ds} wd={wd} layers={layers} {params} seed {seed} P@1 {e['P@1']:.4f} P@5 {e['P@5']:.4f} PSP@5 {e['PSP@5']:.4f} train_s {m.train_seconds_:.1f}", flush=True)
