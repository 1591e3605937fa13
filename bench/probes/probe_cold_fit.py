"""A fit on real data after the warm-up compiles nothing: run twice in a fresh tree (a cold
Numba cache, then a warm one), it prints the warm-up's seconds, the fit's wall and training
seconds, and every kernel signature the fit itself added (none expected).

    PYTHONPATH=<fresh worktree> python bench/probes/probe_cold_fit.py datasets/debcontents \
        [--network]

``--network``: the network alone (``neighbours=0, rerank=False``, as ``compare.py`` runs it).
A signature added here is a compile inside ``train_seconds_`` on a user's first fit: labels
cut by ``max_row_labels`` once reached the kernels with other index dtypes than the warm-up's
tiny set (docs/history.md, eighteenth session).
"""
import argparse
import json
import time

import slide
from slide import warmup


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", help="a folder with train.txt")
    ap.add_argument("--network", action="store_true")
    args = ap.parse_args()
    X, Y = slide.read_xc(args.data + "/train.txt")
    kw = dict(n_threads=2, random_state=0)
    if args.network:
        kw.update(neighbours=0, rerank=False, learning_rate=1e-3, lr_schedule="constant")
    m = slide.SlideClassifier(**kw)
    m._checked_params()
    t = time.perf_counter()
    m._warm_up(X, Y)
    t_warm = time.perf_counter() - t
    before = warmup.kernel_signatures()
    t = time.perf_counter()
    m.fit(X, Y)
    t_fit = time.perf_counter() - t
    after = warmup.kernel_signatures()
    added = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    print(json.dumps({"slide": slide.__file__, "warm_up_s": round(t_warm, 1),
                      "fit_wall_s": round(t_fit, 1), "train_seconds": round(m.train_seconds_, 2),
                      "signatures_added_by_fit": added}))


if __name__ == "__main__":
    main()
