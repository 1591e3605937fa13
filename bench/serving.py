"""Sparse serving (issue 14): recall of the exact top-k and speed against exact inference.

Trains a model (or loads one, ``--model``; ``--save-model`` keeps it for the next run), then
on ``--test-rows`` test rows measures, in one process and after a warm-up call each:

  exact                 ``predict_topk(exact=True)``: every label scored (BLAS)
  serving index         ``slide.kernels.lsh.serving.ServingIndex`` over the output layer's [w ; b]
                        (norm-ranging Simple-LSH, SimHash, collision count, exact re-rank of the
                        C most-colliding labels), over a grid of (norm ranges, bits, tables, C),
                        each with and without the 256-highest-bias prior list
  default               ``predict_topk(exact=False)`` with the derived parameters

Recall = |approx top-k  n  exact top-k| / k, averaged over rows; speed = exact seconds /
method seconds (the hidden layer is computed inside each timed call, as in serving).

    flock /tmp/slide-bench.lock python bench/serving.py --preset xc200k --n-train 50000 \\
        --save-model /tmp/xc200k.slide --out bench/results/serving_xc200k.json
"""
import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np

import slide
from slide.kernels.lsh.serving import ServingIndex, serving_config
from slide.network.trainer import blas_single_thread

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common  # noqa: E402


def load_data(args):
    if args.train:
        X, Y = slide.read_xc(args.train)
        Xt, Yt = slide.read_xc(args.test)
        return X, Y, Xt, Yt, args.train
    X, Y, Xt, Yt = slide.generate(args.preset, n_train=args.n_train, n_test=args.test_rows,
                                  seed=args.seed)
    return X, Y, Xt, Yt, f"{args.preset} n_train {args.n_train}"


def get_model(args, X, Y):
    import os
    if args.model and os.path.exists(args.model):
        return slide.load(args.model), 0.0
    # neighbours=0: the serving index approximates the network's own exact top-k (sparse
    # serving has no neighbour vote), so "exact" is the network alone too
    model = slide.SlideClassifier(sampler=args.sampler, epochs=args.epochs,
                                  random_state=args.seed, n_threads=args.threads, neighbours=0)
    t0 = time.perf_counter()
    model.fit(X, Y)
    secs = time.perf_counter() - t0
    if args.save_model:
        model.save(args.save_model)
    return model, secs


def recall(approx, exact):
    return float(np.mean([np.intersect1d(a[a >= 0], e).size / e.shape[0]
                          for a, e in zip(approx, exact)]))


def best_of(f, repeats):
    """(result, seconds): the fastest of ``repeats`` timed calls after one warm-up call."""
    out = f()
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = f()
        best = min(best, time.perf_counter() - t0)
    return out, best


def p_at_1(Y, top):
    return float(np.asarray(Y[np.arange(top.shape[0]), np.maximum(top[:, 0], 0)]).ravel().mean())


def grid(args, model, Xt, Yt, exact, t_exact, k):
    net = model.network_
    Wo, bo = net.output_view()
    by_bias = np.argsort(-bo, kind="stable").astype(np.int32)     # the prior lists: prefixes
    rows = []
    for ranges, bits, tables in itertools.product(args.ranges, args.bits, args.tables):
        t0 = time.perf_counter()
        ix = ServingIndex.build(Wo, bo, seed=args.seed, n_bits=bits, n_tables=tables,
                                n_ranges=ranges)
        build_s = time.perf_counter() - t0
        for C, pr in itertools.product(args.cands, args.priors):
            if C == 0 and pr == 0:
                continue

            def run():
                H = net.hidden(Xt)
                with blas_single_thread():
                    return ix.topk(H, Wo, bo, k, by_bias[:pr], n_candidates=C)[0]
            top, t = best_of(run, args.repeats)
            r = dict(ranges=ranges, bits=bits, tables=tables, C=C, prior=pr,
                     recall=recall(top, exact), speedup=t_exact / t, seconds=t,
                     P1=p_at_1(Yt, top), build_seconds=build_s)
            rows.append(r)
            print(f"ranges {ranges:6d} bits {bits:2d} tables {tables:3d} C {C:6d} prior {pr:3d}"
                  f"  recall@{k} {r['recall']:.3f}  P@1 {r['P1']:.3f}  speed {r['speedup']:6.1f}x"
                  f"  (build {build_s:.1f} s)", flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="xc200k")
    ap.add_argument("--n-train", type=int, default=50_000)
    ap.add_argument("--train", default=None, help="XC train file (with --test)")
    ap.add_argument("--test", default=None)
    ap.add_argument("--model", default=None, help="load this checkpoint if it exists")
    ap.add_argument("--save-model", default=None)
    ap.add_argument("--sampler", default="random")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--test-rows", type=int, default=2000)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--ranges", type=int, nargs="+", default=[8])
    ap.add_argument("--bits", type=int, nargs="+", default=[12])
    ap.add_argument("--tables", type=int, nargs="+", default=[16])
    ap.add_argument("--cands", type=int, nargs="+", default=[0, 1024, 4096])
    ap.add_argument("--priors", type=int, nargs="+", default=[0, 256, 1024, 4096])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    commit = common.git_commit()
    print(f"commit: {commit}", flush=True)
    X, Y, Xt, Yt, data = load_data(args)
    Xt, Yt = Xt[:args.test_rows], Yt[:args.test_rows]
    Xt.indptr = Xt.indptr.astype(np.int64)
    model, train_s = get_model(args, X, Y)
    k = args.k
    exact, t_exact = best_of(lambda: model.predict_topk(Xt, k=k), args.repeats)
    n_labels = int(Y.shape[1])
    res = dict(commit=commit,
               data=data, n_labels=n_labels, n_train=int(X.shape[0]), rows=int(Xt.shape[0]),
               hidden=int(model.network_.layout.n_in[-1]), train_seconds=train_s,
               exact_seconds=t_exact, exact_P1=p_at_1(Yt, exact),
               derived=serving_config(n_labels, int(model.network_.layout.n_in[-1])))
    print(f"{data}: {n_labels} labels; exact top-{k} of {Xt.shape[0]} rows in {t_exact:.3f} s,"
          f" P@1 {res['exact_P1']:.3f}; derived {res['derived']}", flush=True)
    model.predict_topk(Xt[:8], k=k, exact=False)            # builds the index (not timed)
    for pr in args.priors:
        top, t = best_of(lambda: model.predict_topk(Xt, k=k, exact=False, prior_candidates=pr),
                         args.repeats)
        res[f"default_prior{pr}"] = dict(recall=recall(top, exact), speedup=t_exact / t,
                                         seconds=t, P1=p_at_1(Yt, top))
        print(f"predict_topk(exact=False, prior_candidates={pr}): recall@{k} "
              f"{res[f'default_prior{pr}']['recall']:.3f} speed {t_exact / t:.1f}x", flush=True)
    res["grid"] = grid(args, model, Xt, Yt, exact, t_exact, k)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
