"""A roofline for slide's training step: the work each sample must do, this machine's rates,
and the fraction of the bound each engine reaches.

    python bench/roofline.py --data xc200k --n-train 30000 --out bench/results/roofline_xc200k
    python bench/roofline.py --data datasets/debcontents --out bench/results/roofline_debcontents

Counted per sample of a batch (batch 128, hidden 128, ``shared_negatives`` 2,048 drawn by
label frequency; the counts come from the data and a real draw, not from formulas alone):

* FLOPs: the input layer forward and its weight gradient (2 nnz h each); the output block's
  three products (3 x 2 |S| h); the extras (true labels outside S: 3 x 2 e h).
* Bytes that must move: every touched row of W and of Adam's two moments read and written
  once (6 x 4 h bytes a row; the input layer's touched features, the block's rows, the extras'
  rows), the block's rows gathered once (4 h |S| / B) -- a fused step could do no less. The
  gradient buffers are NOT counted: they are what a fused kernel avoids.

The machine's rates, measured here: the GEMM rate at the block's shape of one OpenBLAS
thread, and of one such call per core at once (the batch split across them) and the memory bandwidth of a Numba
``prange`` triad over 512 MiB with all threads. The bound of a batch is max(FLOPs / GEMM rate,
bytes / bandwidth) (perfect overlap) and, more reachable, their sum. A second memory rate,
the one the step's access allows: the rows real batches touch (each batch's distinct input
features, in the order the engine lists them, and its block and extras in the output layer),
each read and written back in arrays of W's and both moments' sizes, with no arithmetic,
prefetched as the engine does (the best of 1-8 rows ahead), all threads; a step cannot move
its rows faster than that, so the bounds are given at both rates. Each engine
(``per_sample``: before the batched engine; ``batched``: now) trains one epoch of the network
alone after a compile fit (the best of ``--repeat`` such fits); achieved samples/s divided by
the bound's is its fraction.

``--rounds R``: the machine's rates and then the batched engine's epoch, R times; each round's
fraction of its own bounds, their median and range. This host's speed drifts by +-20 % over
minutes, and a fraction of rates measured minutes apart moves with it; the headline tables
still take every rate's best over all rounds. Each round also reads the cores' round trip
before and after its epoch (``bench/crosscore.py``): the host moves this VM's two cores
between one die (~60 ns) and two (~370 ns), which none of the rates above sees and the
two-thread step does; the report gives the fractions by placement.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
from numba import njit, prange

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bench.common import git_commit, machine_description  # noqa: E402,F401
from bench.crosscore import median_round_trip_ns, placement  # noqa: E402
from slide.kernels.prefetch import prefetch_row  # noqa: E402


def load(data, n_train, n_test, seed=0):
    """``data``: a directory of XC files (train.txt, test.txt) or a synthetic preset name;
    the first ``n_train`` training rows and ``n_test`` shuffled test rows."""
    import slide
    from slide import synthetic
    if os.path.isdir(data):
        X, Y = slide.read_xc(os.path.join(data, "train.txt"))
        Xt, Yt = slide.read_xc(os.path.join(data, "test.txt"))
    else:
        X, Y, Xt, Yt = synthetic.generate(data, seed=0, n_train=n_train, n_test=n_test)
    if n_train and X.shape[0] > n_train:
        X, Y = X[:n_train], Y[:n_train]
    order = np.random.default_rng(seed).permutation(Xt.shape[0])[:n_test]
    return X, Y, Xt[order], Yt[order]


def _machine():
    m = machine_description()
    return (f"{m['cpu']}, {m['cores']} cores, {m['ram_bytes'] / 2**30:.0f} GiB RAM; BLAS "
            f"kernels {m['blas']}")


@njit(parallel=True, cache=True)
def _triad(a, b, c, s):
    for i in prange(a.shape[0]):
        a[i] = b[i] + s * c[i]


def memory_bandwidth(mib=512, reps=5):
    """Bytes/s of a triad a = b + s c (3 arrays of ``mib`` MiB: 2 reads, 1 write)."""
    n = mib * 2 ** 20 // 4
    a, b, c = (np.ones(n, np.float32) for _ in range(3))
    _triad(a, b, c, np.float32(2.0))
    best = np.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        _triad(a, b, c, np.float32(2.0))
        best = min(best, time.perf_counter() - t0)
    return 3 * 4 * n / best


@njit(parallel=True, cache=True)
def _row_rmw(W, M, V, rows, h, ahead):
    """Rows ``rows`` of W, M and V (rows of ``h``) read and written back, the access of a row
    step without its arithmetic (values kept near 1: no subnormals), prefetched ``ahead``."""
    n = rows.shape[0]
    for u in prange(n):
        if u + ahead < n:
            b = np.int64(rows[u + ahead]) * h
            prefetch_row(W, b, h)
            prefetch_row(M, b, h)
            prefetch_row(V, b, h)
        b = np.int64(rows[u]) * h
        for i in range(h):
            W[b + i] += np.float32(1e-9)
            M[b + i] = M[b + i] * np.float32(0.5) + np.float32(0.5)
            V[b + i] = V[b + i] * np.float32(0.5) + np.float32(0.5)


def batch_rows(X, Y, neg, batch, seed=0, n_batches=60):
    """The rows ``n_batches`` shuffled batches touch: per batch (input rows, output rows) --
    the distinct features in order of first appearance (as ``touched.feature_entries`` lists
    them) and the block S (a real draw) followed by the true labels outside it."""
    order = np.random.default_rng(seed + 1).permutation(X.shape[0])
    out = []
    for i in range(n_batches):
        rows = order[(i * batch) % (X.shape[0] - batch):][:batch]
        ind = X[rows].indices
        _, first = np.unique(ind, return_index=True)
        S = neg.draw(seed, i)
        ext = np.setdiff1d(Y[rows].indices, S)
        out.append((ind[np.sort(first)].astype(np.int64), np.concatenate([S, ext]).astype(np.int64)))
    return out


def scattered_row_rate(n_in, n_out, h, batches, reps=3):
    """Bytes/s (read + write, 2 x 3 x 4 h a row) of ``_row_rmw`` over ``batches``' input rows
    (arrays of ``n_in`` rows) and output rows (``n_out``): the best of the rows in the
    engine's order and sorted, a prefetch distance of 1, 2, 4 or 8, and ``reps`` passes."""
    arrays = [[np.ones(n * h, np.float32) for _ in range(3)] for n in (n_in, n_out)]
    n_rows = sum(r.shape[0] for b in batches for r in b)
    best = np.inf
    for order in (batches, [tuple(np.sort(r) for r in b) for b in batches]):
        for ahead in (1, 2, 4, 8):
            for rep in range(reps + 1):
                t0 = time.perf_counter()
                for b in order:
                    for (W, M, V), rows in zip(arrays, b):
                        _row_rmw(W, M, V, rows, h, ahead)
                if rep:                 # the first pass compiles and faults the pages in
                    best = min(best, time.perf_counter() - t0)
    return 2 * 3 * 4 * h * n_rows / best


def gemm_rate(B, S, h, threads=1, reps=20):
    """FLOP/s of ``threads`` single-threaded OpenBLAS calls running at once (Python threads:
    numpy releases the GIL), each over the block's three products for its share of the
    batch -- how the batch would split across the cores."""
    import threading
    from threadpoolctl import threadpool_limits
    rng = np.random.default_rng(0)
    b = B // threads
    H = rng.standard_normal((b, h), np.float32)
    W = rng.standard_normal((S, h), np.float32)
    bufs = [(np.empty((b, S), np.float32), np.empty((b, h), np.float32),
             np.empty((S, h), np.float32)) for _ in range(threads)]

    def products(i):
        Z, dH, dW = bufs[i]
        np.matmul(H, W.T, out=Z)
        np.matmul(Z, W, out=dH)
        np.matmul(Z.T, H, out=dW)

    with threadpool_limits(1, user_api="blas"):
        best = np.inf
        for _ in range(reps):
            ts = [threading.Thread(target=products, args=(i,)) for i in range(threads)]
            t0 = time.perf_counter()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            best = min(best, time.perf_counter() - t0)
    return 3 * 2 * b * threads * S * h / best


def step_counts(X, Y, n_shared, exact_head, batch, h, seed=0, n_batches=20):
    """Per sample: nnz, touched input rows, block size, extras (true labels outside S)."""
    from slide.kernels.negatives import SharedNegatives, head_size
    neg = SharedNegatives(n_shared, 1.0, Y.shape[1], head_size(n_shared, exact_head))
    neg.set_label_counts(np.asarray(Y.sum(axis=0)).ravel())
    rng = np.random.default_rng(seed)
    out = {"nnz": [], "touched_in": [], "block": [], "extras": []}
    for i in range(n_batches):
        rows = rng.choice(X.shape[0], batch, replace=False)
        S = neg.draw(seed, i)
        xb, yb = X[rows], Y[rows]
        out["nnz"].append(xb.nnz / batch)
        out["touched_in"].append(np.unique(xb.indices).shape[0] / batch)
        out["block"].append(S.shape[0])
        out["extras"].append((yb.nnz - np.isin(yb.indices, S).sum()) / batch)
    return {k: float(np.mean(v)) for k, v in out.items()}


def bound(c, h, batch, flops_rate, bw, bw_rows=None):
    """(FLOPs, bytes, seconds) per sample, and the two bounds of samples/s (with the bytes at
    ``bw``; with ``bw_rows``, also both at that rate: ``*_rows``)."""
    S = c["block"]
    flops = 4 * c["nnz"] * h + 6 * (S / 1.0) * h + 6 * c["extras"] * h
    touched_rows = c["touched_in"] + S / batch + c["extras"]
    bytes_ = 6 * 4 * h * touched_rows + 4 * h * S / batch
    t_f, t_m = flops / flops_rate, bytes_ / bw
    res = {"flops": flops, "bytes": bytes_, "t_flops": t_f, "t_bytes": t_m,
           "bound_overlap": 1.0 / max(t_f, t_m), "bound_sum": 1.0 / (t_f + t_m)}
    if bw_rows:
        t_r = bytes_ / bw_rows
        res.update(t_bytes_rows=t_r, bound_overlap_rows=1.0 / max(t_f, t_r),
                   bound_sum_rows=1.0 / (t_f + t_r))
    return res


def train_rate(X, Y, engine, threads, n_shared, exact_head, repeat=1):
    """Samples/s of one epoch of the network alone, the best of ``repeat`` fits (as the
    machine's rates are the best of their repetitions)."""
    import slide
    best = 0.0
    for _ in range(max(1, int(repeat))):
        m = slide.SlideClassifier(engine=engine, learning_rate=1e-3, lr_schedule="constant",
                                  epochs=1, n_threads=threads, random_state=0, neighbours=0,
                                  hidden_sizes=(128,),
                                  rerank=False, shared_negatives=n_shared,
                                  exact_head=exact_head)
        m.fit(X, Y)
        best = max(best, X.shape[0] / m.train_seconds_)
    return best


# a round's concurrent GEMM reading is taken again (up to GEMM_RETRIES times, keeping the
# best) while it is below GEMM_FLOOR times one call's rate alone: calls that barely
# overlapped, not the machine. Two rounds of roofline_debcontents_rounds_ac93f06.md read 72.8
# and 92.5 GFLOP/s (one call: ~86) against 118-126 in the others, which lowered their bounds
# and lifted their fractions; two overlapping calls read 1.2-1.5x one call here.
GEMM_RETRIES = 3
GEMM_FLOOR = 1.2


def measure_round(X, Y, c, touched, args, h, batch, engines, one_call=0.0):
    """One round: the machine's rates (GEMM, triad, the touched rows' rate) and then, right
    after them, each engine's epoch, so that the fraction compares rates measured within
    seconds of each other (this host's speed drifts by +-20 % over minutes). ``one_call``:
    one GEMM call's rate alone (``GEMM_FLOOR``: the concurrent calls' reading below it is
    taken again)."""
    flops_rate = gemm_rate(batch, int(c["block"]), h, threads=args.threads)
    retries = 0
    while flops_rate < GEMM_FLOOR * one_call and retries < GEMM_RETRIES:
        flops_rate = max(flops_rate, gemm_rate(batch, int(c["block"]), h, threads=args.threads))
        retries += 1
    bw = memory_bandwidth()
    bw_rows = scattered_row_rate(X.shape[1], Y.shape[1], h, touched)
    b = bound(c, h, batch, flops_rate, bw, bw_rows)
    # where the host has put the cores, before and after the epochs (bench/crosscore.py)
    rtt = [median_round_trip_ns(3)] if args.threads > 1 else []
    rates = {e: train_rate(X, Y, e, args.threads, args.shared_negatives, args.exact_head,
                           args.repeat) for e in engines}
    if args.threads > 1:
        rtt.append(median_round_trip_ns(1))
    return {"core_round_trip_ns": rtt, "placement": placement(*rtt) if rtt else "one core",
            "gemm_flops_per_s": flops_rate, "gemm_retries": retries, "memory_bytes_per_s": bw,
            "scattered_row_bytes_per_s": bw_rows, "bound": b, "samples_per_s": rates,
            "fraction_of_sum_bound": rates["batched"] / b["bound_sum"],
            "fraction_of_sum_bound_rows": rates["batched"] / b["bound_sum_rows"],
            "fraction_of_overlap_bound_rows": rates["batched"] / b["bound_overlap_rows"]}


def round_lines(rounds):
    """The report's table of rounds: each round's rates and the batched engine's fractions of
    that round's own bounds, then their median and range."""
    keys = ("fraction_of_sum_bound", "fraction_of_sum_bound_rows",
            "fraction_of_overlap_bound_rows")
    lines = ["Each round: the machine's rates, then the batched engine's epoch, and its "
             "fraction of that round's bounds (one after the other at the triad's rate; at "
             "the rows' rate; overlapped at the rows' rate); the cores' round trip before and "
             "after the epoch (`bench/crosscore.py`: near, sharing a die; far, on two):", "",
             "| round | cores' round trip, ns | GEMM GFLOP/s | triad GB/s | rows GB/s | "
             "`batched` samples/s | sum-bound (triad) | sum-bound (rows) | max-bound (rows) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rounds):
        rtt = " / ".join(f"{x:.0f}" for x in r.get("core_round_trip_ns", []))
        lines.append(f"| {i + 1} | {rtt} ({r.get('placement', '?')}) | "
                     f"{r['gemm_flops_per_s'] / 1e9:.1f} | "
                     f"{r['memory_bytes_per_s'] / 1e9:.1f} | "
                     f"{r['scattered_row_bytes_per_s'] / 1e9:.1f} | "
                     f"{r['samples_per_s']['batched']:,.0f} | "
                     + " | ".join(f"{r[k]:.2f}" for k in keys) + " |")
    med = [np.median([r[k] for r in rounds]) for k in keys]
    lo = [min(r[k] for r in rounds) for k in keys]
    hi = [max(r[k] for r in rounds) for k in keys]
    lines.append("| median (range) | | | | | | " + " | ".join(
        f"**{m:.2f}** ({a:.2f}-{z:.2f})" for m, a, z in zip(med, lo, hi)) + " |")
    n50 = sum(r["fraction_of_sum_bound_rows"] >= 0.5 for r in rounds)
    lines += ["", f"{n50} of {len(rounds)} rounds at >= 50 % of the sum-bound at the rows' "
              "rate."]
    return lines + placement_lines(rounds)


def placement_lines(rounds):
    """The sum-bound fraction at the rows' rate by the cores' placement in the round."""
    lines = []
    for where in ("near", "far", "mixed"):
        f = [r["fraction_of_sum_bound_rows"] for r in rounds if r.get("placement") == where]
        if f:
            lines.append(f"- cores {where}: {len(f)} round(s), median {np.median(f):.2f} "
                         f"({min(f):.2f}-{max(f):.2f}), {sum(x >= 0.5 for x in f)} at >= 50 %")
    return [""] + lines if lines else []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--n-train", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shared-negatives", type=int, default=None, help="default: slide's")
    ap.add_argument("--exact-head", type=float, default=None, help="default: slide's")
    ap.add_argument("--repeat", type=int, default=1, help="epochs each engine trains (fresh "
                    "fits); the best counts, as for the machine's rates")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of (the machine's rates, "
                    "then the batched engine's epoch), each round's fraction reported with "
                    "their median and range (the per-sample engine: first round only)")
    ap.add_argument("--max-row-labels", type=int, default=None, help="default: slide's; the "
                    "rows are cut as fit cuts them (seed 0) before the counts and the bound")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import slide
    from slide.data.inputs import as_feature_matrix, as_label_matrix, cap_row_labels
    from slide.params import BY_NAME
    if args.shared_negatives is None:
        args.shared_negatives = BY_NAME["shared_negatives"].default
    if args.exact_head is None:
        args.exact_head = BY_NAME["exact_head"].default
    if args.max_row_labels is None:
        args.max_row_labels = BY_NAME["max_row_labels"].default
    commit = git_commit()
    X, Y, _, _ = load(args.data, args.n_train, 10)
    X, Y = as_feature_matrix(X), as_label_matrix(Y, n_rows=X.shape[0])
    # the rows the engines train on (their fits, random_state 0, cut them with seed 0 alike:
    # on rows already cut that is a no-op)
    Y = cap_row_labels(Y, args.max_row_labels, 0)
    h, batch = 128, 128
    slide.SlideClassifier(epochs=1, n_threads=args.threads, neighbours=0, rerank=False,
                          hidden_sizes=(128,),
                          engine="per_sample", random_state=0).fit(X[:2048], Y[:2048])
    slide.SlideClassifier(epochs=1, n_threads=args.threads, neighbours=0, rerank=False,
                          hidden_sizes=(128,),
                          random_state=0).fit(X[:2048], Y[:2048])          # compile both
    c = step_counts(X, Y, args.shared_negatives, args.exact_head, batch, h)
    g1 = gemm_rate(batch, int(c["block"]), h)
    from slide.kernels.negatives import SharedNegatives, head_size
    neg = SharedNegatives(args.shared_negatives, 1.0, Y.shape[1],
                          head_size(args.shared_negatives, args.exact_head))
    neg.set_label_counts(np.asarray(Y.sum(axis=0)).ravel())
    touched = batch_rows(X, Y, neg, batch)
    rounds = [measure_round(X, Y, c, touched, args, h, batch,
                            ("per_sample", "batched") if r == 0 else ("batched",),
                            one_call=g1 if args.threads > 1 else 0.0)
              for r in range(max(1, args.rounds))]
    # the headline: every rate the best of its rounds (and repetitions), as before --rounds
    flops_rate = max(r["gemm_flops_per_s"] for r in rounds)
    bw = max(r["memory_bytes_per_s"] for r in rounds)
    bw_rows = max(r["scattered_row_bytes_per_s"] for r in rounds)
    b = bound(c, h, batch, flops_rate, bw, bw_rows)
    rates = {e: max(r["samples_per_s"][e] for r in rounds if e in r["samples_per_s"])
             for e in ("per_sample", "batched")}
    res = {"data": args.data, "commit": commit, "machine": machine_description(),
           "n_train": X.shape[0], "n_labels": Y.shape[1], "counts_per_sample": c,
           "gemm_flops_per_s_one_thread": g1, "gemm_flops_per_s": flops_rate,
           "memory_bytes_per_s": bw, "scattered_row_bytes_per_s": bw_rows, "bound": b,
           "samples_per_s": rates,
           "fraction_of_overlap_bound": {e: r / b["bound_overlap"] for e, r in rates.items()},
           "fraction_of_sum_bound": {e: r / b["bound_sum"] for e, r in rates.items()},
           "fraction_of_overlap_bound_rows": {e: r / b["bound_overlap_rows"]
                                              for e, r in rates.items()},
           "fraction_of_sum_bound_rows": {e: r / b["bound_sum_rows"] for e, r in rates.items()},
           "rounds": rounds}
    with open(args.out + ".json", "w") as f:
        json.dump(res, f, indent=1)
    lines = [f"# Roofline of the training step: {args.data}", "",
             f"- {X.shape[0]:,} points, {Y.shape[1]:,} labels; hidden {h}, batch {batch}, "
             f"{args.shared_negatives} shared negatives (exact head {args.exact_head}), "
             f"rows cut to {args.max_row_labels} labels, {args.threads} threads",
             f"- commit {commit}; {_machine()}",
             f"- command: `python bench/roofline.py {' '.join(sys.argv[1:])}`", "",
             "| per sample | value |", "|---|---|",
             f"| input nnz | {c['nnz']:.1f} |",
             f"| touched input rows (distinct in the batch / B) | {c['touched_in']:.1f} |",
             f"| block |S| (distinct draws) | {c['block']:.0f} |",
             f"| extras (true labels outside S) | {c['extras']:.2f} |",
             f"| FLOPs | {b['flops'] / 1e6:.2f} M |",
             f"| bytes that must move | {b['bytes'] / 1e3:.0f} kB |",
             f"| arithmetic intensity | {b['flops'] / b['bytes']:.1f} FLOP/byte |", "",
             "| machine | value |", "|---|---|",
             f"| GEMM, one OpenBLAS thread, block shape | {g1 / 1e9:.1f} GFLOP/s |",
             f"| GEMM, {args.threads} such calls at once (the batch split) | "
             f"{flops_rate / 1e9:.1f} GFLOP/s |",
             f"| memory bandwidth (triad, {args.threads} threads) | {bw / 1e9:.1f} GB/s |",
             f"| the step's rows read and written back (scattered rows, {args.threads} threads) "
             f"| {bw_rows / 1e9:.1f} GB/s |", "",
             "| bound / engine | samples/s | fraction of max-bound | fraction of sum-bound |",
             "|---|---|---|---|",
             f"| bound, FLOPs and bytes overlapped (triad) | {b['bound_overlap']:,.0f} | 1 | |",
             f"| bound, FLOPs then bytes (triad) | {b['bound_sum']:,.0f} | | 1 |"]
    for e, r in rates.items():
        lines.append(f"| slide `{e}` | {r:,.0f} | {r / b['bound_overlap']:.2f} | "
                     f"{r / b['bound_sum']:.2f} |")
    lines += ["", "| bound / engine, bytes at the scattered-row rate | samples/s | fraction of "
              "max-bound | fraction of sum-bound |", "|---|---|---|---|",
              f"| bound, overlapped (rows) | {b['bound_overlap_rows']:,.0f} | 1 | |",
              f"| bound, one after the other (rows) | {b['bound_sum_rows']:,.0f} | | 1 |"]
    for e, r in rates.items():
        lines.append(f"| slide `{e}` | {r:,.0f} | {r / b['bound_overlap_rows']:.2f} | "
                     f"{r / b['bound_sum_rows']:.2f} |")
    if len(rounds) > 1:
        lines += ["", *round_lines(rounds)]
    lines += ["", f"FLOPs alone allow {1 / b['t_flops']:,.0f} samples/s, the bytes alone "
              f"{1 / b['t_bytes']:,.0f} at the triad's rate, {1 / b['t_bytes_rows']:,.0f} at "
              "the scattered rows' rate."]
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
