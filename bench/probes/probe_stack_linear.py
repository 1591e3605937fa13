"""Probe (round 5): what would per-label linear evidence on the tf-idf input add to slide's
blend?  Stand-in for such a model: napkinXC's PLT (and its one-vs-rest on debtags), trained
on the same training file; their probabilities are added to slide's blended scores.

    python bench/probes/probe_stack_linear.py debdeps|debtags

If the sum beats both parts clearly, a linear input->label path inside slide is worth
building; if not, the trees' evidence is the same evidence the vote already carries.
"""
import glob
import sys
import tempfile
import time

import numpy as np

from slide import SlideClassifier
from slide.data import read_xc

name = sys.argv[1]
base = {"debdeps": "/work/data/debdeps", "debtags": "/work/shared/data/debtags"}[name]
Xtr, Ytr = read_xc(glob.glob(base + "/train*")[0])
Xte, Yte = read_xc(glob.glob(base + "/test*")[0])
truth = Yte.tocsr()
t0 = time.time()
m = SlideClassifier(n_threads=2, random_state=0).fit(Xtr, Ytr)
print(name, "slide fit", round(time.time() - t0, 1), "s", flush=True)
blend = m.predict_proba(Xte)


def tree_scores(cls):
    from napkinxc import models
    labels = [lab.tolist() for lab in np.split(Ytr.indices.astype(np.int64), Ytr.indptr[1:-1])]
    with tempfile.TemporaryDirectory() as tmp:
        mod = getattr(models, cls)(tmp + "/m", threads=2, seed=0)
        t = time.time()
        mod.fit(Xtr, labels)
        fit_s = time.time() - t
        T = np.zeros(blend.shape, dtype=np.float32)
        for i, pred in enumerate(mod.predict_proba(Xte, top_k=20)):
            for j, p in pred:
                T[i, j] = p
    return T, fit_s


def prec(score):
    top = np.argsort(-score, axis=1)[:, :5]
    hits = np.array([[j in set(truth.indices[truth.indptr[r]:truth.indptr[r + 1]].tolist())
                      for j in top[r]] for r in range(score.shape[0])])
    return hits[:, 0].mean(), hits.mean()


print(name, "slide blend", "P@1 %.4f P@5 %.4f" % prec(blend), flush=True)
for cls in (("PLT", "OVR") if name == "debtags" else ("PLT",)):
    T, fit_s = tree_scores(cls)
    print(name, cls, "fit %.1f s" % fit_s, "P@1 %.4f P@5 %.4f" % prec(T), flush=True)
    for g in (0.1, 0.25, 0.5, 1.0, 2.0):
        print(name, f"blend + {g} * {cls}", "P@1 %.4f P@5 %.4f" % prec(blend + g * T), flush=True)
