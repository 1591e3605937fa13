"""Probe (round 7): seconds and resident memory of each step of the re-ranker's fit at the full
Amazon-670K shape.

    python bench/probes/probe_rerank_scale.py [train seconds]

The full ``amazon670k`` preset's 490,449 training rows; ``SlideClassifier()`` trained for a
few seconds (the weights' quality does not change the cost); the steps of
``slide.rank.rerank.fit_reranker`` inside that ``fit`` each report their seconds and the resident
memory before them and at their peak (a thread samples /proc/self/statm every 10 ms).
"""
import resource
import sys
import threading
import time

from slide import SlideClassifier
from slide.rank import rerank
from slide.network.network import Network
from slide.rank.linear import LabelLinear
from slide.rank.vote import NeighbourMemory
from slide.synthetic import generate

PAGE = 4096 / 2**20
_peak = [0.0]


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


_events = []          # (seconds, what): step starts and ends, and each new process maximum
_T0 = time.perf_counter()
_max = [0.0]


def sampler():
    while True:
        now = rss_mib()
        _peak[0] = max(_peak[0], now)
        if now > _max[0]:
            _max[0] = now
            _events.append((time.perf_counter() - _T0, f"new maximum {now:.0f} MiB"))
        time.sleep(0.01)


threading.Thread(target=sampler, daemon=True).start()


def wrap(owner, attr):
    """Report each call of owner.attr: seconds, resident memory before and at its peak."""
    fn = getattr(owner, attr)

    def call(*a, **k):
        return step(attr, lambda: fn(*a, **k))
    setattr(owner, attr, call)


def step(name, fn):
    outer = _peak[0]                # a step inside another: the outer one keeps its peak
    _peak[0] = rss_mib()
    before = _peak[0]
    t = time.perf_counter()
    _events.append((t - _T0, f"start {name}"))
    out = fn()
    _events.append((time.perf_counter() - _T0, f"end {name}"))
    print(f"{name:40s} {time.perf_counter() - t:7.1f} s   rss {before:7.0f} -> peak "
          f"{_peak[0]:7.0f} MiB", flush=True)
    _peak[0] = max(outer, _peak[0])
    return out


budget = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
X, Y, _, _ = generate("amazon670k", seed=0, n_train=490449, n_test=10)
print(f"data: X nnz {X.nnz}, Y nnz {Y.nnz}; rss {rss_mib():.0f} MiB", flush=True)
print("held-out rows", rerank.holdout_rows(X.shape[0], 0, n_labels=Y.shape[1])[1].shape[0])
for owner, attr in ((rerank, "fit_reranker"), (rerank, "label_centroids"), (rerank, "features"),
                    (rerank.ReRanker, "fit_weights"), (NeighbourMemory, "build"),
                    (NeighbourMemory, "nearest"), (rerank, "label_counts"),
                    (Network, "hidden"), (LabelLinear, "fit")):
    wrap(owner, attr)
_peak[0] = 0.0
m = SlideClassifier(time_budget=budget, random_state=0, n_threads=2).fit(X, Y)
print(f"fit: {m.train_seconds_:.1f} s of training; peak of the process "
      f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB", flush=True)
print("timeline of the fit's last 60 s: step starts/ends and new maxima")
last = _events[-1][0]
for t, what in _events:
    if t > last - 60 and (not what.startswith("new maximum") or float(what.split()[2]) > 2000):
        print(f"{t:8.2f} {what}")
