"""Probes (round 10): the hashed linear classifiers' row budget on debdeps, end to end.

    python bench/probes/probe_round10.py debtags|debdeps SEEDS WORK [WORK ...]

WORK: ``label_linear.MAX_WORK`` (rows x labels of exact logits for the hard negatives; the
default 2e9 keeps every fitting row of debdeps). Fewer rows cut both the exact top-k products
and the classifiers' epochs. One line per run: P@1, P@5, PSP@5 of the test set,
train_seconds_ and the seconds of the classifiers' fit.
"""
import glob
import sys
import time

from slide import SlideClassifier
from slide.rank import linear as label_linear
from slide.data import read_xc
from slide.metrics import inverse_propensity, precision_at_k, psprecision_at_k

name, seeds, works = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], sys.argv[3:]
base = {"debdeps": "/work/data/debdeps", "debtags": "/work/shared/data/debtags"}[name]
X, Y = read_xc(glob.glob(base + "/train*")[0])
Xte, Yte = read_xc(glob.glob(base + "/test*")[0])
inv_p = inverse_propensity(Y)
real_fit = label_linear.fit_classifiers
seconds = [0.0]


def timed(*args, **kw):
    t0 = time.perf_counter()
    out = real_fit(*args, **kw)
    seconds[0] += time.perf_counter() - t0
    return out


label_linear.fit_classifiers = timed
for s in seeds:
    for w in works:
        label_linear.MAX_WORK = int(float(w))
        seconds[0] = 0.0
        m = SlideClassifier(random_state=s).fit(X, Y)
        P = m.predict_topk(Xte, 5)
        metrics = (precision_at_k(Yte, P, 1), precision_at_k(Yte, P, 5),
                   psprecision_at_k(Yte, P, 5, inv_p), m.train_seconds_, seconds[0])
        print(name, f"seed {s} work {w}: P@1 %.4f P@5 %.4f PSP@5 %.4f train %.2f s "
              "classifiers %.2f s" % metrics, flush=True)
