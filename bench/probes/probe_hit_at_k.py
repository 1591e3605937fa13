"""Is the gap to the label trees on a real set one of recall or of ranking? ``SlideClassifier()``
(defaults) and Omikuji (library defaults), each trained once on the same training file, rank
100 labels for every test row; printed per k: hit@k (the share of rows with a true label in
their first k) and P@k. Untimed (fit seconds are printed for orientation only).

    python bench/probes/probe_hit_at_k.py --train datasets/debcontents/train.txt \
        --test datasets/debcontents/test.txt [--seed 0] [--threads 2]

A list that holds a true label as often as the tree's but ranks it first less often points at
the re-ranker; a list that misses rows the tree finds points at the candidates (the network's
top labels and the neighbours' labels).
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

KS = (1, 3, 5, 10, 20, 50, 100)


def hits(top, Y):
    """[rows, k] bool: whether the label at each rank is a true label of its row."""
    Y = Y.tocsr()
    out = np.zeros(top.shape, bool)
    for i in range(top.shape[0]):
        out[i] = np.isin(top[i], Y.indices[Y.indptr[i]:Y.indptr[i + 1]])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import omikuji
    import slide
    from bench.baselines.label_trees import _omikuji_fit, _omikuji_topk
    from bench.common import git_commit
    X, Y = slide.read_xc(args.train)
    Xt, Yt = slide.read_xc(args.test)
    print(f"commit {git_commit()}; {args.train}: {X.shape[0]} rows, {Y.shape[1]} labels; "
          f"test {Xt.shape[0]} rows; seed {args.seed}, {args.threads} threads")
    k = max(KS)
    t = time.perf_counter()
    model = slide.SlideClassifier(random_state=args.seed, n_threads=args.threads).fit(X, Y)
    print(f"slide fit {time.perf_counter() - t:.1f} s (train_seconds_ {model.train_seconds_:.1f})")
    ranked = {"SlideClassifier()": np.asarray(model.predict_topk(Xt, k=k))}
    hyper = omikuji.Model.default_hyper_param()
    tree, _, fit_s = _omikuji_fit(omikuji, args.train, hyper, args.threads)
    print(f"omikuji fit {fit_s:.1f} s")
    ranked["Omikuji"] = _omikuji_topk(tree, Xt.tocsr(), k=k)
    print("| system | " + " | ".join(f"hit@{j}" for j in KS) + " | " +
          " | ".join(f"P@{j}" for j in (1, 5, 10)) + " |")
    print("|---" * (len(KS) + 4) + "|")
    for name, top in ranked.items():
        h = hits(top, Yt)
        print(f"| {name} | " + " | ".join(f"{h[:, :j].any(1).mean():.4f}" for j in KS) +
              " | " + " | ".join(f"{h[:, :j].mean():.4f}" for j in (1, 5, 10)) + " |")


if __name__ == "__main__":
    main()
