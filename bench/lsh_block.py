"""Can an LSH choose part of the batched engine's block? Frequency vs oracle vs LSH, one run.

    python bench/lsh_block.py --data datasets/debcontents --epochs 2 --seeds 0,1,2 \\
        --sizes 1024,2048 --out bench/results/lsh_block_debcontents

The batched engine (``slide.network.block``) computes a shared block S of output neurons for
every sample of a batch as three GEMMs. ``bench/oracle_bound.py`` showed that on the 133k-label
real set a block whose second half is the batch's exact top logits (an oracle, computed
densely and not timed) gains accuracy at equal |S|. This script puts a hash in the oracle's
place, with ALL of its cost counted as training time:

* ``frequency``: ``shared_negatives=|S|`` draws by label frequency (the default engine);
* ``oracle``:   ``|S|/2`` frequency draws + the union of every sample's top logits over all
  labels (exact, dense, its seconds excluded), cut to |S|/2 ids;
* ``headN``:    the engine's exact head (``exact_head = N / |S|``): the N most frequent
  labels in every block with weight 1, |S| - N frequency draws from the other labels;
  ``headN+oracle`` / ``headN+lsh``: the head, then the oracle's or the LSH's |S|/2 ids and
  the remaining draws (does anything beyond the head pay?);
* ``lsh``:      ``|S|/2`` frequency draws + the union of every sample's LSH candidates, cut to
  |S|/2 ids. SimHash tables over the output rows less their mean (h.(w - mean) ranks a
  query's labels as h.w does; the log-prior bias, which dwarfs w, is left to the draws; the
  inner-product augmentation [w, b] / M + sqrt(1 - |v|^2) put most rows into a few buckets),
  ``--K`` bits per table, ``--L`` tables, at most ``--bucket-cap`` ids read per bucket; the
  tables are rebuilt from the current weights every ``--rebuild`` batches. Per sample, the
  ids found in the most of its L buckets (the top ``ceil(4 |S|/2 / batch)``, as the oracle's
  share) join the union; the batch keeps those with the highest count.

The chosen ids join each sample's exact set C (no importance weight), so the frequency draws
still estimate the softmax mass outside C without bias (``slide.kernels.negatives``). The issue's
rule: the LSH must recover at least half of the oracle's gain in accuracy per second to be
worth a place. Network alone (``neighbours=0, rerank=False``), Adam at a constant ``--lr``.
Writes ``OUT.json`` and ``OUT.md``; also reports the recall of the oracle's ids by the LSH's
on the run's batches (``--recall-batches``).
"""
import argparse
import math
import os
import statistics
import sys
import time

import numpy as np
from numba import njit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bench.oracle_bound import (run_study, study_arguments, study_head, summary,  # noqa: E402
                                write_study)
from slide.kernels.lsh.serving import build_tables_kernel  # noqa: E402


@njit(cache=True, nogil=True)
def _choose(qcodes, offsets, items, cap, per_sample, m, counts, touched, hist, out_ids,
            out_score):
    """Per sample: every id in its L buckets counted (at most ``cap`` read per bucket); the
    ``per_sample`` ids of highest count join the batch's candidates with that count as score.
    Returns the number of candidates written to out_ids / out_score (ids may repeat)."""
    B, L = qcodes.shape
    n_out = 0
    for s in range(B):
        nt = 0
        for l in range(L):
            b = qcodes[s, l]
            lo = offsets[l, b]
            hi = min(offsets[l, b + 1], lo + cap)
            for p in range(lo, hi):
                j = items[l, p]
                if counts[j] == 0:
                    touched[nt] = j
                    nt += 1
                counts[j] += 1
        # the count at which the sample's top ``per_sample`` ids start
        hist[:] = 0
        for i in range(nt):
            hist[counts[touched[i]]] += 1
        cut = L
        have = 0
        while cut > 1 and have + hist[cut] < per_sample:
            have += hist[cut]
            cut -= 1
        room = per_sample - have
        for i in range(nt):
            j = touched[i]
            c = counts[j]
            if c > cut or (c == cut and room > 0):
                if c == cut:
                    room -= 1
                out_ids[n_out] = j
                out_score[n_out] = c
                n_out += 1
            counts[j] = 0
    return n_out


def _pack(bits, L, K):
    """[n, L*K] booleans -> [n, L] int64 codes."""
    w = (1 << np.arange(K, dtype=np.int64))
    return (bits.reshape(bits.shape[0], L, K).astype(np.int64) * w).sum(axis=2)


class LSHBlock:
    """The block chooser: SimHash tables over the centred output rows."""

    def __init__(self, K, L, bucket_cap, rebuild, per_sample, seed):
        self.K, self.L, self.cap, self.rebuild = K, L, bucket_cap, rebuild
        self.per_sample = per_sample
        self.rng = np.random.default_rng(seed)
        self.batches = 0
        self.proj = None
        self.seconds = 0.0

    def _build(self, net):
        Wo, bo = net.output_view()
        n, d = Wo.shape
        if self.proj is None:
            self.proj = self.rng.standard_normal((self.L * self.K, d + 2)).astype(np.float32)
            self.counts = np.zeros(n, np.int32)
            self.touched = np.empty(n, np.int64)
            self.hist = np.zeros(self.L + 1, np.int64)
            self.offsets = np.empty((self.L, (1 << self.K) + 1), np.int64)
            self.items = np.empty((self.L, n), np.int64)
        # the rows less their mean: h.(w - mean) ranks a query's labels as h.w does, and
        # without the shared direction (and the log-prior bias, which dwarfs w) the codes
        # spread over the buckets; the bias's share is the frequency draw's. (The projections
        # keep the d + 2 columns of the measured runs; the last two meet zeros.)
        V = np.zeros((n, d + 2), np.float32)
        V[:, :d] = Wo - Wo.mean(axis=0)
        codes = _pack(V @ self.proj.T > 0, self.L, self.K)
        build_tables_kernel(codes, self.offsets, self.items)

    def __call__(self, net, X, rows):
        from slide.data.inputs import take_rows
        t0 = time.perf_counter()
        if self.batches % self.rebuild == 0:
            self._build(net)
        self.batches += 1
        H = net.hidden(take_rows(X, rows))
        Q = np.zeros((H.shape[0], H.shape[1] + 2), np.float32)
        Q[:, :H.shape[1]] = H
        qcodes = _pack(Q @ self.proj.T > 0, self.L, self.K)
        m = net.oracle_m
        ids = np.empty(H.shape[0] * self.per_sample, np.int64)
        score = np.empty(H.shape[0] * self.per_sample, np.int64)
        n = _choose(qcodes, self.offsets, self.items, self.cap, self.per_sample, m,
                    self.counts, self.touched, self.hist, ids, score)
        ids, score = ids[:n], score[:n]
        # the union, each id with its highest count, cut to the m of highest count
        order = np.lexsort((-score, ids))
        ids, score = ids[order], score[order]
        first = np.ones(ids.shape[0], bool)
        first[1:] = ids[1:] != ids[:-1]
        ids, score = ids[first], score[first]
        if ids.shape[0] > m:
            ids = ids[np.argsort(-score, kind="stable")[:m]]
        self.seconds += time.perf_counter() - t0
        return np.sort(ids).astype(np.int32)


def run(X, Y, Xt, Yt, variant, size, seed, args):
    import slide
    from slide.network.network import Network
    from slide.metrics import evaluate, inverse_propensity
    parts = variant.split("+")
    head = int(parts[0][4:] or args.head) if parts[0].startswith("head") else 0
    kind = parts[-1] if parts[-1] in ("oracle", "lsh") else None
    half = size // 2
    n_shared = size if kind is None else size - half
    exact_m = 0 if kind is None else half
    # headN: the engine's own exact head (``exact_head``): the N most frequent labels in
    # every block with weight 1, the rest of the draws from the other labels
    exact_head = head / n_shared
    per_sample = max(1, math.ceil(4 * half / args.batch_size))
    chooser = None
    if kind == "lsh":
        chooser = LSHBlock(args.K, args.L, args.bucket_cap, args.rebuild, per_sample, seed)
    actives = []
    orig_prepare = Network.prepare

    def prepare(net, *a, **k):          # the study hook, set before the scratch is sized
        net.oracle_m, net.oracle_per_sample = exact_m, per_sample
        net.block_chooser = chooser
        return orig_prepare(net, *a, **k)

    Network.prepare = prepare
    try:
        m = slide.SlideClassifier(learning_rate=args.lr, lr_schedule="constant",
                                  epochs=args.epochs, n_threads=args.threads,
                                  random_state=seed, neighbours=0, rerank=False,
                                  batch_size=args.batch_size, shared_negatives=n_shared,
                                  exact_head=exact_head)
        m.fit(X, Y, callback=lambda model, info: actives.append(info["active_mean"]))
    finally:
        Network.prepare = orig_prepare
    oracle_s = m.network_.oracle_seconds
    recall = _recall(m.network_, chooser, X, args) if kind == "lsh" else None
    top = m.predict_topk(Xt, k=5)
    res = evaluate(Yt, top, ks=(1, 5), inv_propensity=inverse_propensity(Y))
    return {"variant": variant, "size": size, "seed": seed, "n_shared": n_shared,
            "exact_m": exact_m, "per_sample": per_sample if exact_m else 0,
            "active_mean": float(np.mean(actives)), "train_seconds": m.train_seconds_ - oracle_s,
            "oracle_seconds": oracle_s,
            "lsh_seconds": chooser.seconds if kind == "lsh" else 0.0,
            "oracle_recall": recall, "P@1": res["P@1"], "P@5": res["P@5"], "PSP@5": res["PSP@5"]}


def _recall(net, chooser, X, args):
    """Mean share of the oracle's ids (trained weights) that the LSH's ids contain."""
    from slide.network.diagnostics import oracle_ids
    rng = np.random.default_rng(7)
    hits = []
    chooser.batches = 0                  # rebuild from the trained weights first
    for _ in range(args.recall_batches):
        rows = np.sort(rng.choice(X.shape[0], args.batch_size, replace=False)).astype(np.int64)
        a = oracle_ids(net, X, rows)
        b = chooser(net, X, rows)
        hits.append(np.intersect1d(a, b).shape[0] / max(a.shape[0], 1))
    return float(np.mean(hits))


def _summary(runs, variants):
    rows = summary(runs, variants, ("active_mean", "train_seconds", "lsh_seconds", "P@1", "P@5",
                                    "PSP@5"))
    for row in rows:
        rec = [r["oracle_recall"] for r in runs if r["size"] == row["size"] and
               r["variant"] == row["variant"] and r["oracle_recall"] is not None]
        row["oracle_recall"] = statistics.mean(rec) if rec else None
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    study_arguments(ap, "1024,2048")
    ap.add_argument("--variants", default="frequency,oracle,lsh")
    ap.add_argument("--K", type=int, default=10)
    ap.add_argument("--L", type=int, default=16)
    ap.add_argument("--bucket-cap", type=int, default=128)
    ap.add_argument("--rebuild", type=int, default=50)
    ap.add_argument("--head", type=int, default=256,
                    help="variant 'head' without a number: this many head labels")
    ap.add_argument("--recall-batches", type=int, default=20)
    args = ap.parse_args()
    variants = args.variants.split(",")
    commit, data, runs, seconds = run_study(args, run, variants)
    rows = _summary(runs, variants)
    lines = study_head(args, commit, data, "The LSH choosing half of the batched engine's block",
                       "lsh_block.py")
    lines += [f"- lsh: SimHash over the output rows less their mean, K={args.K}, L={args.L}, "
              f"<= {args.bucket_cap} ids per bucket, rebuilt every {args.rebuild} batches; its "
              "seconds (tables, hidden pass, queries) count as training; the oracle's do not",
              "", "| block | variant | active ids / sample | train s | of which LSH s | "
              "oracle ids found | P@1 | P@5 | PSP@5 |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        rec = "" if row["oracle_recall"] is None else f"{row['oracle_recall']:.2f}"
        lines.append(f"| {row['size']} | {row['variant']} | {row['active_mean'][0]:.0f} | "
                     f"{row['train_seconds'][0]:.2f} | {row['lsh_seconds'][0]:.2f} | {rec} | "
                     + " | ".join(f"{row[k][0]:.4f} ± {row[k][1]:.4f}"
                                  for k in ("P@1", "P@5", "PSP@5")) + " |")
    lines += ["", "± is the standard deviation over seeds; \"oracle ids found\": the share of "
              "the oracle's ids (trained weights, 20 random batches) among the LSH's."]
    write_study(args, commit, data, runs, rows, seconds, lines)


if __name__ == "__main__":
    main()
