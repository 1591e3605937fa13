"""What a batch costs beyond its work: the engine's batch at several sizes, split into the time
inside its Numba kernels and the time between them.

    python bench/probes/probe_batch_overheads.py [--data datasets/debcontents/train.txt]
        [--sizes 1,8,32,64,128] [--batches 120] [--threads 2]

Without ``--data``: the ``--preset`` (xc200k: 200k labels; 30,000 points). After a warm-up fit
that compiles every kernel, ``Network.train_batch`` (the whole step: forward, products,
softmax, backward, row steps) runs on shuffled batches of each size in turn, round robin, so
that the host's drift falls on every size alike. Every kernel the engine's modules call is
wrapped in a timer, so each batch splits into its kernels' time (dispatch, fork and join
included) and the rest: Python and numpy between the kernels, which after a kernel has swept
the caches runs on cold data (since ``slide.network.block_step`` the batched engine's batch is
one call, ``block_batch``, and the rest is its wrapper's Python). The per-batch cost at one
sample (the block's own rows, the draw, a dozen loops' fork and join, the Python) is what a
larger batch amortises; the rest of the batch scales with its samples. Prints, per size, the
median ms a batch, in kernels and outside them, and the kernels' medians.
"""
import argparse
import importlib
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# the modules whose module-level kernels a batch calls (wrapped by name: the engine's Python
# looks them up there at every call)
ENGINE_MODULES = ("slide.network.block_step", "slide.network.block", "slide.network.optim",
                  "slide.network.batch",
                  "slide.network.network", "slide.network.products", "slide.network.extras",
                  "slide.kernels.negatives", "slide.kernels.touched")


def wrap_kernels(acc):
    """Replace every Numba dispatcher in ENGINE_MODULES by a timer that adds its seconds to
    ``acc[name]`` (kernels calling kernels are compiled already and keep calling the
    originals: only the calls from Python are timed)."""
    from numba.core.registry import CPUDispatcher

    def timed(name, kernel):
        def call(*a, **k):
            t0 = time.perf_counter()
            out = kernel(*a, **k)
            acc[name] = acc.get(name, 0.0) + time.perf_counter() - t0
            return out
        return call

    for module_name in ENGINE_MODULES:
        module = importlib.import_module(module_name)
        for name, value in list(vars(module).items()):
            if isinstance(value, CPUDispatcher):
                setattr(module, name, timed(name, value))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None, help="an XC training file; default: --preset")
    ap.add_argument("--preset", default="xc200k")
    ap.add_argument("--n-train", type=int, default=30000)
    ap.add_argument("--sizes", default="1,8,32,64,128", help="batch sizes, comma-separated")
    ap.add_argument("--batches", type=int, default=120, help="timed batches of each size")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import numba
    import slide
    from threadpoolctl import threadpool_limits
    from bench.common import blas_kernels, git_commit, machine_description
    from bench.crosscore import median_round_trip_ns, placement
    from bench.probes.probe_block_phases import as_fit_rows
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.data:
        X, Y = slide.read_xc(args.data)
    else:
        X, Y, _, _ = slide.synthetic.generate(args.preset, seed=0, n_train=args.n_train,
                                              n_test=10)
    X, Y, cap = as_fit_rows(X, Y)
    m = slide.SlideClassifier(learning_rate=1e-3, lr_schedule="constant", epochs=1,
                              n_threads=args.threads, random_state=0, neighbours=0,
                              rerank=False)
    m.fit(X[:2048], Y[:2048])
    net, opt = m.network_, m.optimizer_
    net.prepare(max(sizes), args.threads, int(np.diff(Y.indptr).max()))
    print(f"commit {git_commit()}; data {args.data or args.preset}: {X.shape[0]} points, "
          f"{Y.shape[1]} labels, rows cut to {cap or 'no'} labels")
    mach = machine_description()
    print(f"{mach['cpu']}, {mach['cores']} cores; Numba threads {args.threads} "
          f"({numba.threading_layer()}); BLAS {blas_kernels()}")
    rtt = [median_round_trip_ns(3)] if args.threads > 1 else []
    order = np.random.default_rng(1).permutation(X.shape[0]).astype(np.int64)
    serial = 10_000
    with threadpool_limits(1, user_api="blas"):
        for s in sizes:
            # before the timers: this X's index types may compile (or load) another
            # specialisation than the warm-up fit's, and a wrapped kernel cannot be compiled
            serial += 1
            net.train_batch(X, Y, order[:s], 0, serial, opt)
    acc = {}
    wrap_kernels(acc)
    n_slots = X.shape[0] // max(sizes)
    per_size = {s: {"total": [], "kernels": [], "each": {}} for s in sizes}
    with threadpool_limits(1, user_api="blas"):
        for b in range(20 + args.batches):
            for s in sizes:
                start = ((b * len(sizes) + sizes.index(s)) % n_slots) * max(sizes)
                rows = order[start:start + s]
                serial += 1
                acc.clear()
                t0 = time.perf_counter()
                net.train_batch(X, Y, rows, 0, serial, opt)
                total = time.perf_counter() - t0
                if b < 20:
                    continue            # untimed: each size's first batches
                rec = per_size[s]
                rec["total"].append(total)
                rec["kernels"].append(sum(acc.values()))
                for name, sec in acc.items():
                    rec["each"].setdefault(name, []).append(sec)
    if rtt:
        rtt.append(median_round_trip_ns(3))
        print(f"cores' round trip before / after: {rtt[0]:.0f} / {rtt[1]:.0f} ns "
              f"({placement(*rtt)}, bench/crosscore.py)")
    print(f"\n{args.batches} batches of each size, round robin; medians, ms a batch\n")
    print("| samples | batch | in kernels | outside them | per sample | kernels (largest first) |")
    print("|---|---|---|---|---|---|")
    for s in sizes:
        rec = per_size[s]
        total = np.median(rec["total"]) * 1e3
        inside = np.median(rec["kernels"]) * 1e3
        outside = np.median(np.subtract(rec["total"], rec["kernels"])) * 1e3
        each = sorted(((np.median(v + [0.0] * (len(rec["total"]) - len(v))) * 1e3, k)
                       for k, v in rec["each"].items()), reverse=True)
        top = ", ".join(f"{k} {v:.3f}" for v, k in each if v >= 0.005)
        print(f"| {s} | {total:.3f} | {inside:.3f} | {outside:.3f} | "
              f"{total / s * 1e3:.1f} us | {top} |")


if __name__ == "__main__":
    main()
