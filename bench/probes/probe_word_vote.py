"""How much a vote of the nearest training rows by input cosine (``slide.rank.words``) can add
to ``SlideClassifier()``, before it is a feature: the model is fitted without it
(``words.K = 0``), its re-ranked top 50 and their probabilities kept; then, per (k, power), the
word vote of each test row's k nearest training rows (similarities raised to the power,
shares summing to 1) is printed alone (P@1 of its best label) and fused by hand with the model,
(1 - beta) * probability + beta * vote over the union of both lists, for a few beta. The beta
is chosen on the test rows here, so the fused figures are an upper bound of what the
re-ranker's learned weight can give; they chose the defaults' k and power. ``--value-powers``:
the index's ``value_power`` (each input value v searched as sign(v) |v| ** it), one table each.

    python bench/probes/probe_word_vote.py --train datasets/debcontents/train.txt \
        --test datasets/debcontents/test.txt [--seed 0] [--grid 20:2,20:1,50:1,50:2] \
        [--value-powers 1,0.5]
"""
import argparse
import os
import sys
import time

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

BETAS = (0.0, 0.3, 0.5, 0.7, 0.8, 0.9)


def word_vote_top(index, Ytr, X, k, power, n_top=50):
    """(ids [n, n_top] -1 padded, vote shares) of the word vote of the rows X."""
    near, sims = index.nearest(X, k)
    w = np.where(near >= 0, np.maximum(sims, 0.0), 0.0).astype(np.float64) ** power
    rows = np.repeat(np.arange(X.shape[0]), k)
    W = sp.csr_matrix((w.ravel(), (rows, np.maximum(near, 0).ravel())),
                      shape=(X.shape[0], Ytr.shape[0]))
    V = (W @ sp.csr_matrix(Ytr, dtype=np.float64)).tocsr()
    totals = np.asarray(V.sum(axis=1)).ravel()
    ids = np.full((X.shape[0], n_top), -1, np.int64)
    val = np.zeros((X.shape[0], n_top))
    for r in range(X.shape[0]):
        a, b = V.indptr[r], V.indptr[r + 1]
        order = np.argsort(-V.data[a:b], kind="stable")[:n_top]
        ids[r, :order.shape[0]] = V.indices[a:b][order]
        val[r, :order.shape[0]] = V.data[a:b][order] / (totals[r] or 1.0)
    return ids, val


def fused_precision(truth, m_ids, m_val, v_ids, v_val, beta):
    """(P@1, P@5) of (1 - beta) * model + beta * vote over each row's two lists."""
    p1 = p5 = 0.0
    for r in range(m_ids.shape[0]):
        score = {}
        for j, s in zip(m_ids[r], m_val[r]):
            score[int(j)] = (1.0 - beta) * s
        for j, v in zip(v_ids[r], v_val[r]):
            if j >= 0:
                score[int(j)] = score.get(int(j), 0.0) + beta * v
        top = sorted(score, key=lambda j: -score[j])[:5]
        p1 += top[0] in truth[r]
        p5 += sum(j in truth[r] for j in top) / 5.0
    return p1 / m_ids.shape[0], p5 / m_ids.shape[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--grid", default="20:2,20:1,50:1,50:2,10:2",
                    help="k:power pairs, comma-separated")
    ap.add_argument("--value-powers", default="1,0.5", help="comma-separated")
    args = ap.parse_args()
    import slide
    from slide.rank import words
    from slide.rank.words import WordIndex
    Xtr, Ytr = slide.read_xc(args.train)[:2]
    Xte, Yte = slide.read_xc(args.test)[:2]
    Xtr, Xte, Yte = sp.csr_matrix(Xtr), sp.csr_matrix(Xte), sp.csr_matrix(Yte)
    truth = [set(Yte.indices[Yte.indptr[r]:Yte.indptr[r + 1]].tolist())
             for r in range(Yte.shape[0])]
    saved, words.K = words.K, 0
    try:
        model = slide.SlideClassifier(random_state=args.seed, n_threads=2).fit(Xtr, Ytr)
        m_ids, m_val = model.predict_topk_scored(Xte, k=50)
    finally:
        words.K = saved
    print(f"{args.train}: seed {args.seed}; SlideClassifier() without the word vote: "
          f"fit {model.train_seconds_:.1f} s")
    for value_power in args.value_powers.split(","):
        print(f"\nvalue_power {value_power}:\n")
        table(WordIndex.build(Xtr, value_power=float(value_power)), args.grid, Ytr, Xte, truth,
              m_ids, m_val)


def table(index, grid, Ytr, Xte, truth, m_ids, m_val):
    """One row per k:power of ``grid``: the vote alone and fused with the model."""
    print("| k | power | vote alone P@1 | seconds (test rows) | "
          + " | ".join(f"beta {b}: P@1 / P@5" for b in BETAS) + " |")
    print("|---|---|---|---|" + "---|" * len(BETAS))
    for pair in grid.split(","):
        k, power = int(pair.split(":")[0]), float(pair.split(":")[1])
        t = time.perf_counter()
        v_ids, v_val = word_vote_top(index, Ytr, Xte, k, power)
        secs = time.perf_counter() - t
        alone = np.mean([v_ids[r, 0] in truth[r] for r in range(len(truth))])
        cells = [fused_precision(truth, m_ids, m_val, v_ids, v_val, b) for b in BETAS]
        print(f"| {k} | {power:g} | {alone:.4f} | {secs:.1f} | "
              + " | ".join(f"{a:.4f} / {b:.4f}" for a, b in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
