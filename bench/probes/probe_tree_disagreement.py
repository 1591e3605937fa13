"""Where Omikuji's first label is right and ``SlideClassifier()``'s is not: both trained on the
same split (Omikuji's defaults, 2 threads), each test row's top 10 kept; printed: P@1 of each
and of both, P@1 by the row's number of labels, and by the training frequency of the label each
puts first (how often each picks such a label, and how often it is right), then a few rows only
Omikuji gets right, with their heaviest input words and each system's first three labels.

    python bench/probes/probe_tree_disagreement.py --data datasets/debcontents [--seed 0]
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="a folder with train.txt, test.txt, "
                    "labels.txt, features.txt (test_points.txt if there)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--examples", type=int, default=12)
    args = ap.parse_args()
    import omikuji
    import slide
    from bench.common import git_commit
    D = args.data
    X, Y = slide.read_xc(os.path.join(D, "train.txt"))
    Xt, Yt = slide.read_xc(os.path.join(D, "test.txt"))
    Yt = Yt.tocsr()
    top_s = slide.SlideClassifier(n_threads=2, random_state=args.seed).fit(X, Y) \
        .predict_topk(Xt, k=10)
    tree = omikuji.Model.train_on_data(os.path.join(D, "train.txt"),
                                       omikuji.Model.default_hyper_param(), n_threads=2)
    top_o = np.full((Xt.shape[0], 10), -1, np.int64)
    for i in range(Xt.shape[0]):
        r = Xt[i]
        for j, (label, _) in enumerate(tree.predict(list(zip(r.indices.tolist(),
                                                             r.data.tolist())), top_k=10)):
            top_o[i, j] = label
    labels = open(os.path.join(D, "labels.txt")).read().split("\n")
    words = open(os.path.join(D, "features.txt")).read().split("\n")
    points_file = os.path.join(D, "test_points.txt")
    points = open(points_file).read().split("\n") if os.path.exists(points_file) else None
    freq = np.asarray(Y.sum(axis=0)).ravel()
    n = Xt.shape[0]

    def first_right(top):
        return np.array([top[i, 0] in set(Yt.indices[Yt.indptr[i]:Yt.indptr[i + 1]].tolist())
                         for i in range(n)])
    hs, ho = first_right(top_s), first_right(top_o)
    print(f"commit {git_commit()}; {D}; seed {args.seed}; {n:,} test rows\n")
    print(f"P@1 slide {hs.mean():.4f}, Omikuji {ho.mean():.4f}; both right {(hs & ho).mean():.4f}, "
          f"only Omikuji {(ho & ~hs).mean():.4f}, only slide {(hs & ~ho).mean():.4f}\n")
    n_labels = np.diff(Yt.indptr)
    print("| labels of the row | rows | slide P@1 | Omikuji P@1 |\n|---|---|---|---|")
    for lo, hi in [(1, 2), (2, 4), (4, 10), (10, 50), (50, 10 ** 9)]:
        sel = (n_labels >= lo) & (n_labels < hi)
        print(f"| [{lo}, {hi if hi < 10 ** 9 else 'inf'}) | {sel.sum()} | {hs[sel].mean():.3f} | "
              f"{ho[sel].mean():.3f} |")
    print("\n| training count of the first label | slide: share of rows, right | "
          "Omikuji: share of rows, right |\n|---|---|---|")
    fs, fo = freq[top_s[:, 0]], freq[top_o[:, 0]]
    for lo, hi in [(0, 5), (5, 20), (20, 100), (100, 1000), (1000, 10 ** 9)]:
        ss, so = (fs >= lo) & (fs < hi), (fo >= lo) & (fo < hi)
        print(f"| [{lo}, {hi if hi < 10 ** 9 else 'inf'}) | {ss.mean():.3f}, {hs[ss].mean():.3f} | "
              f"{so.mean():.3f}, {ho[so].mean():.3f} |")
    rng = np.random.default_rng(args.seed)
    only_o = np.flatnonzero(ho & ~hs)
    print("\nRows only Omikuji gets right (label: training count):")
    for i in rng.choice(only_o, min(args.examples, only_o.shape[0]), replace=False):
        r = Xt[i]
        heavy = [words[f] for f in r.indices[np.argsort(-r.data)[:6]]]
        name = points[i] if points else str(i)
        print(f"- {name} ({n_labels[i]} labels; {', '.join(heavy)}): Omikuji "
              + ", ".join(f"{labels[j]}: {int(freq[j])}" for j in top_o[i, :3])
              + "; slide " + ", ".join(f"{labels[j]}: {int(freq[j])}" for j in top_s[i, :3]))


if __name__ == "__main__":
    main()
