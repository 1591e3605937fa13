"""Probe (round 7): seconds and resident memory of each step of the re-ranker's fit at the full
Amazon-670K shape.

    python bench/probes/probe_rerank_scale.py [train seconds]

The full ``amazon670k`` preset's 490,449 training rows; ``SlideClassifier(rerank=False)``
trained for a few seconds (the weights' quality does not change the cost), then the steps of
``slide.rerank.fit_reranker`` one by one, each with its seconds and the resident memory it
reached (a thread samples /proc/self/statm every 10 ms), under the BLAS thread limit ``fit``
puts them under.
"""
import sys
import threading
import time

import numpy as np

from slide import SlideClassifier, rerank
from slide.neighbours import NeighbourMemory
from slide.synthetic import generate
from slide.trainer import blas_single_thread

PAGE = 4096 / 2**20
_peak = [0.0]


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def sampler():
    while True:
        _peak[0] = max(_peak[0], rss_mib())
        time.sleep(0.01)


threading.Thread(target=sampler, daemon=True).start()


def step(name, fn):
    _peak[0] = rss_mib()
    before = _peak[0]
    t = time.perf_counter()
    out = fn()
    print(f"{name:40s} {time.perf_counter() - t:7.1f} s   rss {before:7.0f} -> peak "
          f"{_peak[0]:7.0f} MiB", flush=True)
    return out


budget = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
X, Y, _, _ = generate("amazon670k", seed=0, n_train=490449, n_test=10)
print(f"data: X nnz {X.nnz}, Y nnz {Y.nnz}; rss {rss_mib():.0f} MiB", flush=True)
m = SlideClassifier(time_budget=budget, random_state=0, n_threads=2, rerank=False,
                    neighbours=0).fit(X, Y)
net = m.network_
fit_rows, held_rows = rerank.holdout_rows(X.shape[0], 0, n_labels=Y.shape[1])
print("held-out rows", held_rows.shape[0], flush=True)
X.sort_indices()
with blas_single_thread():
    H_all = step("hidden of every row", lambda: net.hidden(X))
    H_held = H_all[held_rows]
    memory = step("memory build", lambda: NeighbourMemory.build(H_all, Y, copy=False))
    del H_all
    Y_fit = step("rows only", lambda: rerank._rows_only(Y, fit_rows))
    terms = rerank.centroid_terms(Y.shape[1])
    cen = step(f"centroids ({terms} terms)", lambda: rerank.label_centroids(X, Y_fit, terms))
    Xh = X[held_rows]
    Xh.sort_indices()
    lc = np.log1p(np.bincount(Y_fit.indices, minlength=Y.shape[1]).astype(np.float64))
    from slide.engine.infer import topk_lse_of_logits
    Wo, bo = net.output_view()
    step("logits of 1,024 held rows", lambda: topk_lse_of_logits(H_held[:1024], Wo, bo, 10))
    step("nearest of 1,024 held rows", lambda: memory.nearest(H_held[:1024], 20, held_rows))
    step("features of 1,024 held rows", lambda: rerank.features(
        net, Xh[:1024], H_held[:1024], memory, 20, cen, rerank.N_TOP, exclude=held_rows,
        log_count=lc))
    step("fit_reranker (whole)", lambda: rerank.fit_reranker(net, X, Y, fit_rows, held_rows,
                                                             20, 0))
