"""Ensemble curve: K members (seeds 100, 101, ...) of one configuration; prints each member's
P@1 and the P@1 of the average of the first k members' softmax probabilities, k = 1..K.

    python bench/probes/probe.py debdeps 3 '{"epochs": 1}'
"""
import sys, json, time
import numpy as np
from slide import SlideClassifier, metrics
from slide.data import read_xc
ds = sys.argv[1]; K = int(sys.argv[2]); params = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
root = {"debtags": "/work/shared/data/debtags", "debdeps": "/work/data/debdeps"}[ds]
Xtr, Ytr = read_xc(root + "/train.txt"); Xte, Yte = read_xc(root + "/test.txt")
inv = metrics.inverse_propensity(Ytr)
def softmax(z):
    z = z - z.max(1, keepdims=True); e = np.exp(z); return e / e.sum(1, keepdims=True)
def topk(P, k=5):
    idx = np.argpartition(-P, k, 1)[:, :k]; v = np.take_along_axis(P, idx, 1)
    return np.take_along_axis(idx, np.argsort(-v, 1), 1)
acc = None; tot = 0.0; members = []
for k in range(K):
    m = SlideClassifier(**params, n_threads=2, random_state=100 + k).fit(Xtr, Ytr)
    tot += m.train_seconds_
    parts = []
    for a in range(0, Xte.shape[0], 2000):
        parts.append(softmax(m.predict_scores(Xte[a:a+2000])))
    P = np.vstack(parts)
    top = topk(P)
    members.append(metrics.evaluate(Yte, top, ks=(1,5), inv_propensity=inv)["P@1"])
    acc = P if acc is None else acc + P
    top = topk(acc)
    e = metrics.evaluate(Yte, top, ks=(1,5), inv_propensity=inv)
    print(f"{ds} {params} K={k+1} member P@1 {members[-1]:.4f} ens P@1 {e['P@1']:.4f} P@5 {e['P@5']:.4f} PSP@5 {e['PSP@5']:.4f} train_s {tot:.1f}", flush=True)
