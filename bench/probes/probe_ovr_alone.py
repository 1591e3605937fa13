"""Probe (round 9): the one-vs-rest classifiers alone on debtags, refitted on the same rows.

    python bench/probes/probe_ovr_alone.py THREADS[,THREADS...]

For each thread count, three fits of ``label_linear.OneVsRest`` on the re-ranker's fitting
rows (seed 0), each scored on every label of the test rows: P@1, P@5, the largest |weight|
and the bias range. A HOGWILD fit differs from run to run on more than one thread; one that
diverges shows as a large weight and a low P@1.
"""
import sys
import time

import numba
import numpy as np
import scipy.sparse as sp

from slide.rank import linear as label_linear
from slide.rank import rerank
from slide.data import read_xc
from slide.metrics import precision_at_k

X, Y = read_xc("/work/shared/data/debtags/train.txt")
Xt, Yt = read_xc("/work/shared/data/debtags/test.txt")
fit_rows, _ = rerank.holdout_rows(X.shape[0], 0, rerank.MIN_HOLDOUT_ROWS, Y.shape[1])
Xs = label_linear.strongest_terms(Xt)
norms = np.sqrt(np.asarray(Xs.multiply(Xs).sum(1)).ravel())
norms[norms == 0] = 1
Xn = sp.diags(1 / norms) @ Xs
for threads in [int(a) for a in sys.argv[1].split(",")]:
    numba.set_num_threads(threads)
    for rep in range(3):
        t0 = time.perf_counter()
        ovr = label_linear.OneVsRest.fit(X, Y, fit_rows, seed=0)
        seconds = time.perf_counter() - t0
        kept = ovr.slot >= 0
        W = np.zeros((X.shape[1], Y.shape[1]), np.float32)
        W[kept] = ovr.weights[ovr.slot[kept]]
        top = np.argsort(-(np.asarray(Xn @ W) + ovr.bias), axis=1)[:, :5]
        print(f"threads {threads} fit {rep}: {seconds:.2f} s, alone P@1 %.4f P@5 %.4f, "
              "largest |weight| %.2f, bias %.2f to %.2f" % (
                  precision_at_k(Yt, top, 1), precision_at_k(Yt, top, 5),
                  np.abs(ovr.weights).max(), ovr.bias.min(), ovr.bias.max()), flush=True)
