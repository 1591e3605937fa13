"""Probes (round 8): where the last points of debtags (0.958 against the trees' 0.962) might be.

    python bench/probes/probe_round8.py holdout debtags|debdeps SEEDS
    python bench/probes/probe_round8.py postpass debtags|debdeps SEEDS
    python bench/probes/probe_round8.py loss debtags|debdeps SEEDS
    python bench/probes/probe_round8.py maxwork debtags|debdeps SEEDS MAX_WORKS
    python bench/probes/probe_round8.py ovr debtags SEED DUMP.npz EPOCHS LR

SEEDS: comma-separated. One line per run (P@1, P@5 of the test set, train_seconds_).

- ``holdout``: the price of the re-ranker's held-out slice. ``rerank=False`` (network and
  vote) fitted on all training rows against the same fitted on the re-ranker's 90 %; then the
  defaults against a "leaky" re-ranker (the network trained on every row, the re-ranker fitted
  on held-out rows the network has seen).
- ``postpass``: after the defaults' fit, one pass of the network over the held-out rows at a
  fraction of the learning rate, the memory rebuilt, the fitted re-ranker kept.
- ``loss``: the sigmoid loss and 2 epochs with the re-ranker (both helped the vote, round 4).
- ``maxwork``: the linear classifiers on a seeded subset of the fitting rows
  (``slide.label_linear.MAX_WORK`` lowered: fewer exact logit rows for the hard negatives).
- ``ovr``: a dense one-vs-rest logistic classifier per label (every label a negative of every
  row, Adagrad over the L2-normalised input, fitted on the re-ranker's fitting rows) scored
  on the candidates of a ``probe_rerank_dump.py`` dump, added to or in place of the linear
  score; the re-ranker refitted offline (``ReRanker.fit_weights``).
"""
import glob
import sys
import time

import numpy as np
import scipy.sparse as sp
from numba import njit, prange

from slide import SlideClassifier, rerank, trainer
from slide.data import iterate_minibatches, read_xc
from slide.logistic import expand
from slide.metrics import precision_at_k

mode, name = sys.argv[1], sys.argv[2]
base = {"debdeps": "/work/data/debdeps", "debtags": "/work/shared/data/debtags"}[name]
X, Y = read_xc(glob.glob(base + "/train*")[0])
Xte, Yte = read_xc(glob.glob(base + "/test*")[0])


def report(tag, m):
    P = m.predict_topk(Xte, 5)
    print(name, tag, "P@1 %.4f P@5 %.4f train %.2f s" % (
        precision_at_k(Yte, P, 1), precision_at_k(Yte, P, 5), m.train_seconds_), flush=True)


class Leaky(SlideClassifier):
    """The network trains on every row; the re-ranker is still fitted on the held-out split."""

    def _fit_core(self, X, Y, eval_set, callback, resume):
        hs, sparse = self._checked_params()
        X, Y = self._check_data(X, Y, fitted=False)
        self._build(X.shape[1], Y.shape[1], hs, sparse)
        split = self._rerank_split(X.shape[0], Y.shape[1])
        self._train(X, Y, trainer.resolve_epochs(self.epochs, X.shape[0], self.batch_size),
                    None, None)
        t0 = time.perf_counter()
        self._build_memory(X, Y, split)
        self.train_seconds_ += time.perf_counter() - t0


def seeds():
    return [int(s) for s in sys.argv[3].split(",")]


if mode == "holdout":
    for s in seeds():
        fit_rows, _ = rerank.holdout_rows(X.shape[0], s, rerank.MIN_HOLDOUT_ROWS, Y.shape[1])
        for tag, rows in (("rerank=False all rows", np.arange(X.shape[0])),
                          ("rerank=False the 90 %", fit_rows)):
            m = SlideClassifier(random_state=s, rerank=False).fit(X[rows], Y[rows])
            report(f"{tag} seed {s}", m)
        report(f"defaults seed {s}", SlideClassifier(random_state=s).fit(X, Y))
        report(f"leaky re-ranker seed {s}", Leaky(random_state=s).fit(X, Y))

elif mode == "postpass":
    from slide.neighbours import NeighbourMemory
    from slide.trainer import NetworkSteps, blas_single_thread
    for s in seeds():
        report(f"defaults seed {s}", SlideClassifier(random_state=s).fit(X, Y))
        for frac in (0.02, 0.1, 0.3):
            m = SlideClassifier(random_state=s).fit(X, Y)
            t0 = time.perf_counter()
            Xc, Yc = m._check_data(X, Y, fitted=True)
            held = m._rerank_split(X.shape[0], Y.shape[1])[1]
            rr = m.network_.reranker
            steps, n_threads = NetworkSteps(m), m._threads()
            steps.start(Xc, Yc, n_threads)
            serial = m.batches_
            for b in iterate_minibatches(held.shape[0], m.batch_size, s + 7, 0, 0):
                serial += 1
                steps.step(Xc, Yc, held[b], serial, m.learning_rate * frac, n_threads)
            m.sync()
            m.network_.release_scratch()
            with blas_single_thread():
                m.network_.memory = NeighbourMemory.build(m.network_.hidden(Xc), Yc, copy=False)
            m.network_.reranker = rr
            m.train_seconds_ += time.perf_counter() - t0
            report(f"post-pass lr x {frac} seed {s}", m)

elif mode == "loss":
    for s in seeds():
        for kw in ({}, {"loss": "sigmoid"}, {"epochs": 2}, {"loss": "sigmoid", "epochs": 2}):
            report(f"{kw} seed {s}", SlideClassifier(random_state=s, **kw).fit(X, Y))

elif mode == "maxwork":
    import slide.label_linear as ll
    for s in seeds():
        for mw in [float(a) for a in sys.argv[4].split(",")]:
            ll.MAX_WORK = int(mw)
            report(f"MAX_WORK {mw:.1e} seed {s}", SlideClassifier(random_state=s).fit(X, Y))

elif mode == "ovr":
    seed, dump, epochs, lr = int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), float(sys.argv[6])

    def l2(A):
        A = sp.csr_matrix(A, dtype=np.float32)
        nr = np.sqrt(np.asarray(A.multiply(A).sum(1)).ravel())
        nr[nr == 0] = 1
        A = (sp.diags(1 / nr) @ A).tocsr().astype(np.float32)
        A.sort_indices()
        return A

    @njit(cache=True, parallel=True)
    def ovr_epoch(xp, xi, xd, yp, yi, order, W, G, b, gb, lr):
        n_labels = b.shape[0]
        for q in prange(order.shape[0]):
            r = order[q]
            z = b.copy()
            for p in range(xp[r], xp[r + 1]):
                for j in range(n_labels):
                    z[j] += xd[p] * W[xi[p], j]
            g = 1.0 / (1.0 + np.exp(-z))
            for p in range(yp[r], yp[r + 1]):
                g[yi[p]] -= 1.0
            for j in range(n_labels):
                gb[j] += g[j] * g[j]
                b[j] -= lr * g[j] / np.sqrt(gb[j] + 1e-8)
            for p in range(xp[r], xp[r + 1]):
                f = xi[p]
                for j in range(n_labels):
                    gg = g[j] * xd[p]
                    G[f, j] += gg * gg
                    W[f, j] -= lr * gg / np.sqrt(G[f, j] + 1e-8)

    @njit(cache=True, parallel=True)
    def pair_scores(xp, xi, xd, rows, labs, W, b, out):
        for u in prange(rows.shape[0]):
            r, j = rows[u], labs[u]
            s = b[j]
            for p in range(xp[r], xp[r + 1]):
                s += xd[p] * W[xi[p], j]
            out[u] = s

    fit_rows, held_rows = rerank.holdout_rows(X.shape[0], seed, rerank.MIN_HOLDOUT_ROWS,
                                              Y.shape[1])
    Xf, Yf = l2(X[fit_rows]), sp.csr_matrix(Y[fit_rows])
    W = np.zeros((X.shape[1], Y.shape[1]), np.float32)
    G = np.zeros_like(W)
    counts = np.bincount(Yf.indices, minlength=Y.shape[1])
    b = np.log((counts + 0.5) / (fit_rows.shape[0] + 1.0)).astype(np.float32)
    gb = np.zeros_like(b)
    rng = np.random.default_rng(seed)
    args = (Xf.indptr.astype(np.int64), Xf.indices, Xf.data, Yf.indptr.astype(np.int64),
            Yf.indices.astype(np.int64))
    ovr_epoch(*args, rng.permutation(Xf.shape[0])[:64], W.copy(), G.copy(), b.copy(),
              gb.copy(), np.float32(lr))           # compile outside the clock
    t0 = time.perf_counter()
    for _ in range(epochs):
        ovr_epoch(*args, rng.permutation(Xf.shape[0]), W, G, b, gb, np.float32(lr))
    fit_s = time.perf_counter() - t0
    d = np.load(dump)

    def scores(A, rows, labs):
        A = l2(A)
        out = np.empty(rows.shape[0], np.float32)
        pair_scores(A.indptr.astype(np.int64), A.indices, A.data, rows.astype(np.int64),
                    labs.astype(np.int64), W, b, out)
        return out

    sh, st = scores(X[held_rows], d["rh"], d["lh"]), scores(Xte, d["rt"], d["lt"])
    n_test = d["nte"].shape[0]

    def p1(s):
        order = np.lexsort((-s, d["rt"]))
        first = np.ones(order.shape[0], bool)
        first[1:] = d["rt"][order][1:] != d["rt"][order][:-1]
        return d["tt"][order[first]].sum() / n_test

    def reranked(Fh, Ft):
        mean, scale, coef, icpt = rerank.ReRanker.fit_weights(Fh, d["th"], 0)
        return p1(expand((Ft - mean) / scale) @ coef + icpt)

    Fh, Ft = d["Fh"], d["Ft"]
    print(name, f"ovr seed {seed} E={epochs} lr={lr}: fit {fit_s:.2f} s, alone P@1 %.4f; "
          "re-ranker: dump's 11 features %.4f, 10 (no linear) %.4f, + ovr %.4f, ovr in place "
          "of linear %.4f" % (p1(st), reranked(Fh, Ft), reranked(Fh[:, :10], Ft[:, :10]),
                              reranked(np.column_stack([Fh, sh]), np.column_stack([Ft, st])),
                              reranked(np.column_stack([Fh[:, :10], sh]),
                                       np.column_stack([Ft[:, :10], st]))), flush=True)
else:
    raise SystemExit(__doc__)
