"""Probe behind the neighbour vote's settings (round 4, issue 15): one default network per set,
then the vote's levers on its test set, and a few training levers with the vote on.

    python bench/probes/neighbour_vote.py debdeps|debtags [--train-levers]

Prints one line per setting: P@1 on every test point of
- the network alone, the vote alone and the blend (1 - w) p + w vote, for k nearest rows in
  {5, 10, 20, 50}, similarity power in {1, 16} and w in {0.5, 0.7, 0.85, 0.95};
- the vote over other spaces: the tf-idf input rows themselves (cosine), and the pre-ReLU
  hidden layer;
- a label-centroid classifier (cosine to the mean hidden row of each label), blended in;
- with --train-levers: a fresh fit per training lever (epochs, width, negatives, loss) with
  the default vote, seconds included.
"""
import glob
import sys
import time

import numpy as np
import scipy.sparse as sp

import slide
from slide import metrics, neighbours
from slide.data import read_xc

PATHS = {"debdeps": "/work/data/debdeps", "debtags": "/work/shared/data/debtags"}


def p1(Y, top):
    return round(metrics.evaluate(Y, top, ks=(1,))["P@1"], 4)


def top1(M):
    M = M.toarray() if sp.issparse(M) else M
    return np.argmax(M, axis=1)[:, None]


def softmax(Z):
    Z = Z - Z.max(axis=1, keepdims=True)
    P = np.exp(Z)
    return P / P.sum(axis=1, keepdims=True)


def vote(Htr, Ytr, Hq, k, power):
    old = neighbours.POWER
    neighbours.POWER = float(power)
    try:
        return neighbours.NeighbourMemory.build(Htr, Ytr).vote(Hq, k).toarray()
    finally:
        neighbours.POWER = old


def sparse_vote(Xtr, Ytr, Xq, k, block=1000):
    """The vote over the (unit-L2, sparse) input rows themselves, power 1."""
    Yc = Ytr.tocsr().astype(np.float32)
    out = []
    for a in range(0, Xq.shape[0], block):
        S = (Xq[a:a + block] @ Xtr.T).toarray()
        near = np.argpartition(-S, k - 1, axis=1)[:, :k]
        w = np.maximum(np.take_along_axis(S, near, axis=1), 0)
        rows = np.repeat(np.arange(S.shape[0]), k)
        Wm = sp.csr_matrix((w.ravel(), (rows, near.ravel())), shape=(S.shape[0], Xtr.shape[0]))
        V = (Wm @ Yc).toarray()
        out.append(V / np.maximum(V.sum(axis=1, keepdims=True), 1e-30))
    return np.vstack(out)


def main(name, train_levers):
    base = PATHS[name]
    Xtr, Ytr = read_xc(glob.glob(base + "/train*")[0])
    Xte, Yte = read_xc(glob.glob(base + "/test*")[0])
    m = slide.SlideClassifier(n_threads=2, random_state=0).fit(Xtr, Ytr)
    print(f"{name} SlideClassifier() seed 0: train {m.train_seconds_:.1f}s", flush=True)
    net = m.network_
    P = softmax(m.predict_scores(Xte))
    Htr, Hte = net.hidden(Xtr), net.hidden(Xte)
    print(f"{name} network alone: P@1 {p1(Yte, top1(P))}", flush=True)
    for k in (5, 10, 20, 50):
        for power in (1, 16):
            V = vote(Htr, Ytr, Hte, k, power)
            blends = {w: p1(Yte, top1((1 - w) * P + w * V)) for w in (0.5, 0.7, 0.85, 0.95)}
            print(f"{name} hidden vote k={k} power={power}: alone {p1(Yte, top1(V))} "
                  f"blend {blends}", flush=True)
    # other spaces for the vote
    Vx = sparse_vote(Xtr, Ytr, Xte, 30)
    print(f"{name} tf-idf input vote k=30 power=1: alone {p1(Yte, top1(Vx))} blend 0.35 "
          f"{p1(Yte, top1(0.65 * P + 0.35 * Vx))}", flush=True)
    W0 = net.layout.weight_view(net.W, 0)
    B0 = net.layout.bias_view(net.B, 0)
    pre_tr, pre_te = np.asarray(Xtr @ W0) + B0, np.asarray(Xte @ W0) + B0
    Vp = vote(pre_tr, Ytr, pre_te, 20, 16)
    print(f"{name} pre-ReLU hidden vote k=20 power=16: alone {p1(Yte, top1(Vp))} blend 0.85 "
          f"{p1(Yte, top1(0.15 * P + 0.85 * Vp))}", flush=True)
    V = vote(Htr, Ytr, Hte, 20, 16)
    B = 0.15 * P + 0.85 * V
    Hn = Htr / np.maximum(np.linalg.norm(Htr, axis=1, keepdims=True), 1e-9)
    C = np.asarray(Ytr.T.astype(np.float32) @ Hn)
    C /= np.maximum(np.linalg.norm(C, axis=1, keepdims=True), 1e-9)
    Cs = (Hte / np.maximum(np.linalg.norm(Hte, axis=1, keepdims=True), 1e-9)) @ C.T
    Pc = softmax(10 * Cs)
    print(f"{name} label centroids (hidden): alone {p1(Yte, top1(Cs))} with the blend 0.2 "
          f"{p1(Yte, top1(0.8 * B + 0.2 * Pc))}", flush=True)
    if not train_levers:
        return
    for cfg in ({}, {"epochs": 4}, {"hidden_sizes": (256,)}, {"shared_negatives": 4096},
                {"loss": "sigmoid"}):
        t0 = time.perf_counter()
        m = slide.SlideClassifier(n_threads=2, random_state=0, **cfg).fit(Xtr, Ytr)
        wall = time.perf_counter() - t0
        with_vote = p1(Yte, m.predict_topk(Xte, k=1))
        alone = p1(Yte, m.predict_topk(Xte, k=1, neighbours=0))
        print(f"{name} train lever {cfg}: train {m.train_seconds_:.1f}s (fit wall {wall:.1f}s) "
              f"with the vote {with_vote} network alone {alone}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], "--train-levers" in sys.argv[2:])
