"""Sanity baselines on debcontents (is the task learnable?): untimed, one run, test split.

    PYTHONPATH=. python bench/probes/probe_debcontents_sanity.py [datasets/debcontents] \
        2>/dev/null | tee bench/results/data_debcontents_sanity.log

Prints P@1 / P@5 of (1) the label prior (the 5 most frequent training labels for every point),
(2) a 10-nearest-neighbour vote (cosine on the L2-normalised tf-idf rows, each neighbour's
labels weighted by its similarity), (3) Omikuji with its default (Parabel-like) hyper-parameters,
2 threads.
"""
import sys
import time

import numpy as np
import omikuji

import slide

d = (sys.argv[1] if len(sys.argv) > 1 else "datasets/debcontents").rstrip("/") + "/"
Xtr, Ytr = slide.read_xc(d + "train.txt")
Xte, Yte = slide.read_xc(d + "test.txt")
Xte, Yte, Ytr = Xte.tocsr(), Yte.tocsr(), Ytr.tocsr()
truth = [set(Yte.indices[Yte.indptr[i]:Yte.indptr[i + 1]].tolist()) for i in range(Yte.shape[0])]
print(f"{d}: train {Xtr.shape[0]} test {Xte.shape[0]} features {Xtr.shape[1]} "
      f"labels {Ytr.shape[1]}", flush=True)


def pk(pred, k):
    return float(np.mean([len(set(p[:k]) & t) / k for p, t in zip(pred, truth)]))


def report(name, pred, seconds):
    print(f"{name:10s} P@1 {pk(pred, 1):.4f} P@5 {pk(pred, 5):.4f} ({seconds:.0f} s)", flush=True)


t = time.time()
top = np.argsort(-np.asarray(Ytr.sum(axis=0)).ravel(), kind="stable")[:5].tolist()
report("prior", [top] * Xte.shape[0], time.time() - t)

t = time.time()
S = (Xte @ Xtr.T).tocsr()
pred = []
for i in range(S.shape[0]):
    cols, sims = S.indices[S.indptr[i]:S.indptr[i + 1]], S.data[S.indptr[i]:S.indptr[i + 1]]
    order = np.argsort(-sims, kind="stable")[:10]
    score = {}
    for j, s in zip(cols[order], sims[order]):
        for lab in Ytr.indices[Ytr.indptr[j]:Ytr.indptr[j + 1]]:
            score[lab] = score.get(lab, 0.0) + float(s)
    pred.append([lab for lab, _ in sorted(score.items(), key=lambda x: -x[1])[:5]])
report("10-NN", pred, time.time() - t)

t = time.time()
model = omikuji.Model.train_on_data(d + "train.txt", omikuji.Model.default_hyper_param(),
                                    n_threads=2)
pred = []
for i in range(Xte.shape[0]):
    lo, hi = Xte.indptr[i], Xte.indptr[i + 1]
    feats = list(zip(Xte.indices[lo:hi].tolist(), Xte.data[lo:hi].tolist()))
    pred.append([lab for lab, _ in model.predict(feats, top_k=5)])
report("omikuji", pred, time.time() - t)
