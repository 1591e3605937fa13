"""How each batch's time moves over a run: ``SlideClassifier.fit`` (the network alone) on a
synthetic preset with a callback that stamps the clock after every batch, then the batch times
by tenth of the run, the slowest batches, and how many of the optimizer's Adam moments are
subnormal float32 or below ``slide.network.adam.MOMENT_FLOOR`` when the run stops.

    python bench/probes/probe_batch_times.py --preset amazon670k --n-train 100000 [--epochs 2]
        [--moments-at 700]

A flat profile is what a per-batch engine should show; a stretch of slow batches tied to the
batch count (not the clock: ``--sleep-at`` pauses the run to tell them apart) points at state
that builds up, as subnormal first moments did (``bench/results/subnormal_moments_*.log``).
``--moments-at N``: a second fit, stopped by its callback after batch N, counts the moments
there (the first fit's own count is taken after its closing sync).
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def moment_counts(opt, floor):
    """{name: (nonzero, subnormal, nonzero below floor)} of the optimizer's float32 moments."""
    tiny = np.finfo(np.float32).tiny
    out = {}
    for name in ("MW", "VW", "MB", "VB"):
        a = np.abs(getattr(opt, name))
        nz = a != 0
        out[name] = (int(nz.sum()), int((nz & (a < tiny)).sum()), int((nz & (a < floor)).sum()))
    return out


def print_counts(title, counts):
    print(title)
    for name, (nz, sub, below) in counts.items():
        print(f"  {name}: {nz:,} nonzero, {sub:,} subnormal, {below:,} below the floor")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="amazon670k")
    ap.add_argument("--n-train", type=int, default=100000)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sleep-at", type=int, default=0, help="pause this many seconds ...")
    ap.add_argument("--sleep-seconds", type=float, default=3.0, help="... after this batch")
    ap.add_argument("--moments-at", type=int, default=0, help="count the moments in a "
                    "second fit stopped after this batch (0: no second fit)")
    args = ap.parse_args()
    import slide
    from bench.common import git_commit
    from slide.data.inputs import as_feature_matrix, as_label_matrix
    from slide.network import adam
    floor = float(getattr(adam, "MOMENT_FLOOR", np.finfo(np.float32).tiny))
    X, Y, _, _ = slide.synthetic.generate(args.preset, seed=0, n_train=args.n_train, n_test=10)
    X = as_feature_matrix(X)
    Y = as_label_matrix(Y, n_rows=X.shape[0])
    print(f"commit {git_commit()}; {args.preset}: {X.shape[0]} points, {Y.shape[1]} labels; "
          f"{args.epochs} epoch(s), {args.threads} threads; moment floor {floor:.3g}")
    kw = dict(learning_rate=1e-3, lr_schedule="constant", epochs=args.epochs,
              n_threads=args.threads, random_state=0, neighbours=0, rerank=False)
    slide.SlideClassifier(**kw).fit(X[:2048], Y[:2048])     # compile outside the clock
    times, last = [], [0.0]

    def stamp(model, info):
        now = time.perf_counter()
        times.append(now - last[0])
        if info["batch"] == args.sleep_at:
            time.sleep(args.sleep_seconds)
        last[0] = time.perf_counter()   # the pause is in no batch's time

    model = slide.SlideClassifier(**kw)
    t0 = last[0] = time.perf_counter()
    model.fit(X, Y, callback=stamp)
    total = time.perf_counter() - t0 - (args.sleep_seconds if args.sleep_at else 0.0)
    d = np.array(times) * 1e3
    print(f"fit {total:.2f} s (a pause excluded); {d.shape[0]} batches: median "
          f"{np.median(d):.2f} ms, mean {d.mean():.2f}, 90th percentile "
          f"{np.percentile(d, 90):.2f}, sum {d.sum() / 1e3:.2f} s (the first batch includes "
          f"the fit's setup, an epoch's last its closing sync)")
    k = max(1, d.shape[0] // 10)
    print("mean ms a batch by tenth of the run: " + " ".join(
        f"{d[i * k:(i + 1) * k].mean():.2f}" for i in range(10)))
    slow = np.sort(np.argsort(d)[::-1][:20])
    print("the 20 slowest batches (number: ms): " + " ".join(
        f"{i + 1}: {d[i]:.1f}" for i in slow))
    print_counts("moments at the end of the fit (after its closing sync):",
                 moment_counts(model.optimizer_, floor))
    if args.moments_at:
        second = slide.SlideClassifier(**kw)
        second.fit(X, Y, callback=lambda model, info: info["batch"] >= args.moments_at)
        print_counts(f"moments after batch {args.moments_at} (a second fit, stopped there):",
                     moment_counts(second.optimizer_, floor))


if __name__ == "__main__":
    main()
