"""Probes (round 9): the re-ranker's linear_score classifiers on debtags, end to end.

    python bench/probes/probe_round9.py debtags|debdeps SEEDS VARIANT [VARIANT ...]

SEEDS: comma-separated. VARIANT: ``hashed`` (the hard-negative ``LabelLinear``, one-vs-rest
made unaffordable), ``ovr`` (the defaults: ``OneVsRest``, factored Adagrad, at most
2**24 weights: debtags' 5k single-row features dropped), ``ovr-2^25`` (every feature kept),
``ovr-5ep`` (5 epochs, not 3), ``ovr-adagrad`` (a squared-gradient sum per weight, 5 epochs:
the round-8 probe's optimizer, here in the model). One line per run: P@1, P@5 of the test
set, train_seconds_, the seconds of the classifiers' fit (compiled outside the clocks: one
untimed fit first) and the size of the saved model.
"""
import glob
import os
import sys
import tempfile
import time

import numpy as np
from numba import njit, prange

from slide import SlideClassifier
from slide.rank import linear as label_linear
from slide.data import read_xc
from slide.data.inputs import take_rows
from slide.metrics import precision_at_k

name, seeds, variants = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], sys.argv[3:]
base = {"debdeps": "/work/data/debdeps", "debtags": "/work/shared/data/debtags"}[name]
X, Y = read_xc(glob.glob(base + "/train*")[0])
Xte, Yte = read_xc(glob.glob(base + "/test*")[0])


@njit(cache=True, parallel=True)
def adagrad_epoch(xp, xi, xd, yp, yi, order, W, G, b, gb, lr):
    """ovr_epoch with a squared-gradient sum per weight (G, beside W [features, labels])."""
    n_labels = b.shape[0]
    for q in prange(order.shape[0]):
        r = order[q]
        p0, p1 = xp[r], xp[r + 1]
        inv = label_linear._inv_norm(xd, p0, p1)
        z = np.zeros(n_labels, np.float32)
        for p in range(p0, p1):
            for j in range(n_labels):
                z[j] += xd[p] * inv * W[xi[p], j]
        for j in range(n_labels):
            z[j] = 1.0 / (1.0 + np.exp(-(z[j] + b[j])))
        for t in range(yp[r], yp[r + 1]):
            z[yi[t]] -= 1.0
        for j in range(n_labels):
            gb[j] += z[j] * z[j]
            b[j] -= lr * z[j] / np.sqrt(gb[j] + 1e-8)
        for p in range(p0, p1):
            f, v = xi[p], xd[p] * inv
            for j in range(n_labels):
                gw = z[j] * v
                G[f, j] += gw * gw
                W[f, j] -= lr * gw / np.sqrt(G[f, j] + 1e-8)


def adagrad_fit(net, X, Y, rows, seed=0, H=None):
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x0F12])
    Xr = label_linear.strongest_terms(take_rows(X, rows))
    Yr = take_rows(Y, rows)
    n_labels = Y.shape[1]
    W = np.zeros((X.shape[1], n_labels), np.float32)
    G = np.zeros_like(W)
    counts = np.bincount(Yr.indices, minlength=n_labels)
    b = np.log((counts + 0.5) / (Xr.shape[0] + 1.0)).astype(np.float32)
    gb = np.zeros(n_labels, np.float32)
    for _ in range(5):
        adagrad_epoch(Xr.indptr.astype(np.int64), Xr.indices, Xr.data.astype(np.float32),
                      Yr.indptr.astype(np.int64), Yr.indices.astype(np.int64),
                      rng.permutation(Xr.shape[0]), W, G, b, gb,
                      np.float32(label_linear.OVR_LEARNING_RATE))
    # every feature its own row of weights: the model's scoring kernel
    return label_linear.OneVsRest(W, np.arange(X.shape[1], dtype=np.int32), b)


DEFAULTS = dict(MAX_OVR_WORK=label_linear.MAX_OVR_WORK,
                MAX_OVR_WEIGHTS=label_linear.MAX_OVR_WEIGHTS,
                OVR_EPOCHS=label_linear.OVR_EPOCHS)
SETTINGS = {"hashed": dict(MAX_OVR_WORK=0), "ovr": {}, "ovr-2^25": dict(MAX_OVR_WEIGHTS=1 << 25),
            "ovr-5ep": dict(OVR_EPOCHS=5), "ovr-adagrad": {}}
real_fit = label_linear.fit_classifiers
seconds = [0.0]


def timed(fit):
    def run(*args, **kw):
        t0 = time.perf_counter()
        out = fit(*args, **kw)
        seconds[0] += time.perf_counter() - t0
        return out
    return run


for s in seeds:
    for v in variants:
        for k, val in dict(DEFAULTS, **SETTINGS[v]).items():
            setattr(label_linear, k, val)
        fit = adagrad_fit if v == "ovr-adagrad" else real_fit
        if v == "ovr-adagrad":      # compiled outside the clocks
            fit(None, X[:64], Y[:64], np.arange(64))
        label_linear.fit_classifiers = timed(fit)
        seconds[0] = 0.0
        m = SlideClassifier(random_state=s).fit(X, Y)
        P = m.predict_topk(Xte, 5)
        with tempfile.TemporaryDirectory() as tmp:
            m.save(os.path.join(tmp, "m.slide"))
            size = os.path.getsize(os.path.join(tmp, "m.slide")) / 2 ** 20
        print(name, f"seed {s} {v}: P@1 %.4f P@5 %.4f train %.2f s classifiers %.2f s "
              "model %.0f MiB" % (precision_at_k(Yte, P, 1), precision_at_k(Yte, P, 5),
                                  m.train_seconds_, seconds[0], size), flush=True)
