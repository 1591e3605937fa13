"""Input-feature dropout emulated by data: the training set repeated E times, each copy with
its own random feature mask (kept values scaled 1/(1-p)), trained 1 epoch = E epochs of
batches with a fresh mask per pass.

    python bench/probes/probe_drop.py debtags 0,0.2,0.4
"""
import sys, json
import numpy as np, scipy.sparse as sp
from slide import SlideClassifier, metrics
from slide.data import read_xc
ds = sys.argv[1]; ps = [float(x) for x in sys.argv[2].split(",")]; E = 3
root = {"debtags": "/work/shared/data/debtags", "debdeps": "/work/data/debdeps"}[ds]
Xtr, Ytr = read_xc(root + "/train.txt"); Xte, Yte = read_xc(root + "/test.txt")
inv = metrics.inverse_propensity(Ytr)
rng = np.random.default_rng(0)
for p in ps:
    copies = []
    for e in range(E):
        X = Xtr.copy()
        if p > 0:
            keep = rng.random(X.nnz) >= p
            X.data = np.where(keep, X.data / (1 - p), 0).astype(np.float32)
            X.eliminate_zeros()
        copies.append(X)
    XA = sp.vstack(copies).tocsr(); YA = sp.vstack([Ytr] * E).tocsr()
    for seed in (0,):
        m = SlideClassifier(epochs=1, n_threads=2, random_state=seed).fit(XA, YA)
        e = metrics.evaluate(Yte, m.predict_topk(Xte, k=5), ks=(1, 5), inv_propensity=inv)
        print(f"{ds} input dropout p={p} x{E} copies, 1 epoch, seed {seed} P@1 {e['P@1']:.4f} P@5 {e['P@5']:.4f} PSP@5 {e['PSP@5']:.4f} train_s {m.train_seconds_:.1f}", flush=True)
