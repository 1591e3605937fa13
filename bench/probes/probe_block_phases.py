"""Where the time of a batched-engine batch goes: each step of ``slide.network.block`` timed on
its own, over ``--batches`` shuffled batches of a data set (after a warm-up fit that compiles
every kernel), BLAS single-threaded as in training (``--blas-threads`` to compare). The steps
are called from Python one by one, as ``block.forward_backward`` and ``block.update`` do; a fit
calls the same kernels from one compiled function (``slide.network.block_step``), without the
Python and dispatch between them (``probe_batch_overheads.py``).

    python bench/probes/probe_block_phases.py [--data datasets/debcontents] [--batches 150]

Without ``--data``: the ``--preset`` (xc200k: 200k labels; 30,000 points). Prints milliseconds per
batch for: the shared draw (beside the first layer's listing), the per-sample forward (hidden
layers, active sets), the gather of the block's rows with the first product, the corrected
softmax, the two backward products with the bias sums, the per-sample backward, the touched-row listing, the
hidden layers' step, and the row steps of the first layer, the extras and the block (one loop;
``--separate-steps``: three, as before); then the total and
samples/s. ``--compare`` times the engine before this round's many-core changes (each batch's
draw beside its listing, 4 samples a chunk, every sample's extras in its own loop), after them,
and each change alone, in one process on the same batches, and ends with a summary table;
``--compare-steps`` likewise the row steps as one loop and as three. ``--by-placement S``:
each step's time with the cores on one die and on two (``bench/crosscore.py``), over S
seconds of blocks of batches. With ``--ab-rev REV`` (and ``--by-placement``) the blocks
alternate between the engine as checked out and the engine with ``--ab-modules`` as at git
revision REV (``--ab-attrs``: the functions swapped block by block), so that a change is
measured against its base in one process, by placement (single runs in two processes differ by
more than most changes: the host's rates drift by the hour):

    python bench/probes/probe_block_phases.py --preset xc200k --by-placement 90 --ab-rev HEAD~1 \
        --ab-modules slide.kernels.touched,slide.network.block \
        --ab-attrs slide.network.block:block_forward
"""
import argparse
import importlib
import os
import subprocess
import sys
import time
import types

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None, help="an XC training file; default: --preset")
    ap.add_argument("--preset", default="xc200k", help="a synthetic preset (xc200k, "
                    "amazon670k, ...) when no --data")
    ap.add_argument("--n-train", type=int, default=30000, help="rows of the preset")
    ap.add_argument("--batches", type=int, default=150)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--blas-threads", type=int, default=1, help="OpenBLAS threads for the "
                    "products (training uses 1: more fight Numba's spinning threads)")
    ap.add_argument("--draw-ahead", type=int, default=1, help="1: the shared negatives drawn "
                    "ahead, one batch a thread (the default); 0: each batch's draw beside its "
                    "listing, as before")
    ap.add_argument("--chunks-per-thread", type=int, default=None, help="the per-sample "
                    "loops' scheduling (block.CHUNKS_PER_THREAD; 0: always CHUNK samples)")
    ap.add_argument("--extras-task", type=int, default=None, help="block.EXTRAS_TASK: extras "
                    "a task beside the products takes (a huge value: none, as before)")
    ap.add_argument("--separate-steps", action="store_true", help="the first layer's, the "
                    "extras' and the block's row steps as three parallel loops, one kind of row "
                    "each (the engine runs them as one, ``SparseOptimizer.step_batch_rows``)")
    ap.add_argument("--row-chunk", type=int, default=None, help="the most rows a thread takes "
                    "at a time from the fused row steps (optim.ROW_CHUNK)")
    ap.add_argument("--compare-steps", action="store_true", help="the row steps as one loop "
                    "and as three, alternating three times each in this process, and a summary")
    ap.add_argument("--compare", action="store_true", help="time the engine before the "
                    "many-core changes, after them and each alone, one after the other in this "
                    "process (``COMPARE``), and print a summary table")
    ap.add_argument("--max-row-labels", type=int, default=None, help="cut each row to this "
                    "many labels as fit does (default: slide's max_row_labels; 0: uncut)")
    ap.add_argument("--by-placement", type=float, default=0.0, help="seconds: time blocks "
                    "of 30 batches (the first 5 untimed), each between two readings of the "
                    "cores' round trip (bench/crosscore.py), for this long, and print each "
                    "step's median ms a batch over the blocks with the cores near (one die) "
                    "and far (two); a block whose readings disagree is left out")
    ap.add_argument("--warm-batches", type=int, default=20, help="batches run untimed first "
                    "(a kernel the warm-up fit did not compile in these types compiles there)")
    ap.add_argument("--ab-rev", default=None, help="with --by-placement: alternate blocks "
                    "with --ab-modules as at this git revision")
    ap.add_argument("--ab-modules", default="", help="dotted module names loaded from "
                    "--ab-rev, dependencies first (a later one's imports of an earlier one get "
                    "the old one)")
    ap.add_argument("--ab-attrs", default="", help="module:function pairs swapped for the "
                    "old modules' ones in every other block (the engine's own calls look them "
                    "up there)")
    args = ap.parse_args()
    import numba
    import slide
    from bench.common import git_commit
    from slide.network import block as BK
    from slide.network import extras as EX
    from slide.kernels.arrays import csr
    from threadpoolctl import threadpool_limits
    global SEPARATE_STEPS
    SEPARATE_STEPS = args.separate_steps
    if args.row_chunk:
        from slide.network import optim
        optim.ROW_CHUNK = args.row_chunk
    BK.DRAW_AHEAD = bool(args.draw_ahead)
    if args.extras_task is not None:
        EX.EXTRAS_TASK = args.extras_task
    if args.chunks_per_thread is not None:
        BK.CHUNKS_PER_THREAD = max(args.chunks_per_thread, 0)
    if args.data:
        X, Y = slide.read_xc(args.data)
    else:
        X, Y, _, _ = slide.synthetic.generate(args.preset, seed=0, n_train=args.n_train,
                                              n_test=10)
    X, Y, cap = as_fit_rows(X, Y, args.max_row_labels)
    print(f"commit {git_commit()}; data {args.data or args.preset}: {X.shape[0]} points, "
          f"{Y.shape[1]} labels, rows cut to {cap or 'no'} labels")
    m = slide.SlideClassifier(learning_rate=1e-3, lr_schedule="constant", epochs=1,
                              n_threads=args.threads, random_state=0, neighbours=0,
                              rerank=False)
    m.fit(X[:2048], Y[:2048])
    net, opt = m.network_, m.optimizer_
    net.prepare(128, args.threads, int(np.diff(Y.indptr).max()))
    order = np.random.default_rng(1).permutation(X.shape[0]).astype(np.int64)
    Xc, Yc = csr(X), csr(Y)
    as_set = (BK.DRAW_AHEAD, BK.CHUNKS_PER_THREAD, EX.EXTRAS_TASK)
    configs = COMPARE if args.compare else [("as set", as_set)]
    if args.compare_steps:
        configs = [(f"row steps {kind}", as_set) for _ in range(3)
                   for kind in ("fused", "separate")]
    n_batches = min(args.batches, X.shape[0] // 128 - args.warm_batches)
    print(f"BLAS threads {args.blas_threads}, Numba threads {args.threads} "
          f"({args.warm_batches} batches untimed first, then {n_batches} timed)")
    rows_of = [order[128 * b:128 * (b + 1)] for b in range(args.warm_batches + n_batches)]
    if args.by_placement > 0:
        variants = [("checked out", {})]
        if args.ab_rev:
            variants.append((args.ab_rev, revision_swaps(args.ab_rev, args.ab_modules,
                                                         args.ab_attrs)))
        with threadpool_limits(args.blas_threads, user_api="blas"):
            for _, swaps in variants[::-1]:
                with swapped(swaps):
                    _time_batches(net, opt, X, Xc, Yc, rows_of[:3], 500, 1)
            by_placement(net, opt, X, Xc, Yc, order, args.by_placement, variants=variants)
        return
    summary = []
    with threadpool_limits(args.blas_threads, user_api="blas"):
        for k, (name, (ahead, per_thread, task)) in enumerate(configs):
            BK.DRAW_AHEAD, BK.CHUNKS_PER_THREAD, EX.EXTRAS_TASK = ahead, per_thread, task
            if args.compare_steps:
                SEPARATE_STEPS = name.endswith("separate")
            T = _time_batches(net, opt, X, Xc, Yc, rows_of, 1000 * (k + 1), args.warm_batches)
            total = sum(T.values())
            print(f"\n{name}: draw ahead {ahead}, chunk {BK.chunk_size(128)}, extras task "
                  f"{task}; threading layer {numba.threading_layer()}")
            for key, v in T.items():
                print(f"{key:24s} {v / n_batches * 1e3:6.2f} ms")
            print(f"{'total':24s} {total / n_batches * 1e3:6.2f} ms a batch of 128, "
                  f"{128 * n_batches / total:,.0f} samples/s ({n_batches} batches)")
            steps = sum(v for key, v in T.items() if "row step" in key or "rows step" in key)
            summary.append((name, total / n_batches * 1e3, 128 * n_batches / total,
                            steps / n_batches * 1e3))
    if len(summary) > 1:
        print("\n| configuration | ms a batch | samples/s | of which row steps, ms |\n"
              "|---|---|---|---|")
        for name, ms, rate, steps in summary:
            print(f"| {name} | {ms:.2f} | {rate:,.0f} | {steps:.2f} |")


def as_fit_rows(X, Y, max_row_labels=None):
    """(X, Y, cap): the data as fit trains on them -- the canonical dtypes (other index dtypes
    would compile other kernel specialisations inside the timed loop) and each row cut to
    ``max_row_labels`` labels (default: slide's; 0: uncut) with seed 0, as fit does (the probe
    once timed debcontents' uncut rows: up to 9,076 labels where fit sees 256)."""
    from slide.data.inputs import as_feature_matrix, as_label_matrix, cap_row_labels
    from slide.params import BY_NAME
    X = as_feature_matrix(X)
    Y = as_label_matrix(Y, n_rows=X.shape[0])
    cap = BY_NAME["max_row_labels"].default if max_row_labels is None else max_row_labels
    if cap:
        Y = cap_row_labels(Y, cap, 0)
    return X, Y, cap


# --compare: the engine before the many-core changes, after them, and each change alone
# (DRAW_AHEAD, CHUNKS_PER_THREAD, EXTRAS_TASK), before and after twice, interleaved
_BEFORE = (False, 0, 10 ** 9)
_AFTER = (True, 8, 64)
COMPARE = [("before", _BEFORE), ("after", _AFTER), ("before", _BEFORE), ("after", _AFTER),
           ("draw ahead only", (True, 0, 10 ** 9)), ("chunks only", (False, 8, 10 ** 9)),
           ("extras tasks only", (False, 0, 64)), ("draw ahead + extras tasks", (True, 0, 64))]


def revision_swaps(rev, modules, attrs):
    """{(module, name): function} for ``--ab-rev``: ``modules`` (comma-separated, dependencies
    first) compiled from their source at git revision ``rev`` into new module objects, Numba's
    disk cache off for them; while each runs, sys.modules maps the earlier names to their old
    modules, so that its ``from ... import`` gets the old functions. ``attrs``: the
    "module:name" pairs to swap."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    names = [m for m in modules.split(",") if m]
    saved = {n: sys.modules.get(n) for n in names}
    old = {}
    try:
        for name in names:
            path = name.replace(".", "/") + ".py"
            src = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=root, check=True,
                                 capture_output=True, text=True).stdout
            mod = types.ModuleType(name)
            mod.__file__ = f"<{rev}:{path}>"
            sys.modules[name] = mod
            exec(compile(src.replace("cache=True", "cache=False"), mod.__file__, "exec"),
                 mod.__dict__)
            old[name] = mod
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
    swaps = {}
    for pair in (a for a in attrs.split(",") if a):
        mod_name, attr = pair.split(":")
        swaps[(mod_name, attr)] = getattr(old[mod_name], attr)
    return swaps


class swapped:
    """Context: the functions of ``swaps`` ({(module, name): function}) in place of the
    modules' own, put back on exit."""

    def __init__(self, swaps):
        self.swaps, self.kept = swaps, {}

    def __enter__(self):
        for (mod_name, attr), fn in self.swaps.items():
            mod = importlib.import_module(mod_name)
            self.kept[(mod_name, attr)] = getattr(mod, attr)
            setattr(mod, attr, fn)

    def __exit__(self, *exc):
        for (mod_name, attr), fn in self.kept.items():
            setattr(importlib.import_module(mod_name), attr, fn)


def by_placement(net, opt, X, Xc, Yc, order, seconds, block=30, untimed=5, variants=None):
    """``--by-placement``: blocks of ``block`` shuffled batches for ``seconds``, each block's
    steps timed (after ``untimed`` batches) between two readings of the cores' round trip;
    prints each step's median ms a batch over the near blocks and over the far ones.
    ``variants``: [(name, swaps)] taken block by block in turn (``--ab-rev``): a column
    each per placement."""
    import numba
    from bench.crosscore import placement, round_trip_ns
    variants = variants or [("", {})]
    n_b = X.shape[0] // 128
    res = {(w, v): [] for w in ("near", "far") for v, _ in variants}
    b0, serial, t_end, turn = 0, 10 ** 6, time.time() + seconds, 0
    while time.time() < t_end:
        name, swaps = variants[turn % len(variants)]
        turn += 1
        r0 = round_trip_ns(n=20000)
        rows_of = [order[128 * ((b0 + k) % n_b):128 * ((b0 + k) % n_b + 1)]
                   for k in range(block)]
        with swapped(swaps):
            T = _time_batches(net, opt, X, Xc, Yc, rows_of, serial, untimed)
        b0, serial = b0 + block, serial + block + 10
        where = placement(r0, round_trip_ns(n=20000))
        if (where, name) in res:
            res[(where, name)].append({k: v / (block - untimed) * 1e3 for k, v in T.items()})
    one = len(variants) == 1
    cols = list(res) if one else [c for c in res if res[c]]
    print(f"\nthreading layer {numba.threading_layer()}; blocks of {block - untimed} timed "
          "batches: " + ", ".join(f"{len(res[c])} with the cores {' '.join(c).strip()}"
                                  for c in res) + " (medians, ms a batch)\n")
    keys = list(next((v[0] for v in res.values() if v), {}))
    print("| step | " + " | ".join(f"cores {' '.join(c).strip()}" for c in cols)
          + (" | far / near |" if one else " |") + "\n|" + "---|" * (len(cols) + 1 + one))
    for k in keys + ["total"]:
        m = [np.median([sum(T.values()) if k == "total" else T[k] for T in res[c]])
             if res[c] else np.nan for c in cols]
        ratio = f" {m[1] / m[0]:.2f} |" if one else ""
        print(f"| {k} | " + " | ".join(f"{v:.3f}" for v in m) + f" |{ratio}")


# --separate-steps: the three row steps as three loops
SEPARATE_STEPS = False


def _time_batches(net, opt, X, Xc, Yc, rows_of, serial0, n_warm):
    """Seconds of each step summed over the batches ``rows_of`` after the first ``n_warm``."""
    from slide.network import block as BK
    from slide.network import extras as EX
    T = {}

    def tick(k, t0):
        t1 = time.perf_counter()
        T[k] = T.get(k, 0.0) + t1 - t0
        return t1

    for b, rows in enumerate(rows_of):
        if b == n_warm:
            T.clear()
        serial = serial0 + b
        sc, blk = net.sc, net.block
        t = time.perf_counter()
        frows = BK._feature_rows(net, X, rows) if net.fused_first else \
            BK._NO_FEATURE_ROWS
        # the draw (made ahead, or beside the first layer's listing: --draw-ahead)
        shared, frows_left = BK._draw(net, 0, serial, Xc, rows, frows)
        neg = net.negatives.bundle(shared)
        ns = shared.shape[0]
        H, losses = net.store.h_store[:128], net.losses[:128]
        t = tick("draw (and listing)", t)
        with BK._parallel_chunks(128):
            BK.block_forward(net.params, net.spec, net.tables, sc, blk, Xc, Yc, rows,
                             np.uint64(0), np.int64(serial), shared, shared[:0], H, losses,
                             frows_left)
        t = tick("forward (per sample)", t)
        WS, bS = blk.WS[:ns], blk.bS[:ns]
        Z = blk.Z.reshape(-1)[:128 * ns].reshape(128, ns)
        xt = EX.extras_bundle(net, 128, H, net.store.d_store[:128])
        with BK._one_task_a_chunk():
            BK.split_forward_product(xt, shared, WS, bS, Z, BK.product_parts(ns))
        t = tick("gather W_S, Z = H W_S^T", t)
        with BK._parallel_chunks(128):
            BK.block_loss(net.params, net.spec, sc, blk, Yc, rows, neg, Z,
                          BK.block_offsets(bS, shared, neg), xt, losses,
                          np.float32(1 / 128), net.correct, net.loss_marker)
        t = tick("corrected softmax", t)
        dH = blk.dH[:128]
        with BK._one_task_a_chunk():
            BK.split_backward_products(Z, WS, xt, dH, blk.dWS[:ns], blk.dbS[:ns],
                                       BK.product_parts(ns))
        t = tick("dH, dW_S, db_S", t)
        with BK._parallel_chunks(128):
            BK.block_backward(net.params, net.spec, sc, blk, Xc, rows, dH, xt,
                              not net.fused_first)
        t = tick("backward (per sample)", t)
        nr, nbias = net.touched(X, rows, serial)
        t = tick("touched rows", t)
        opt.step(net.params, net.touched_rows, nr, nbias)
        t = tick("hidden layers' step", t)
        nu = BK.output_entries(blk.extra[:128], blk.counts[:128, 2:3], 0,
                               net.store.d_store.shape[1], net.out_rows, np.int64(serial))
        first, extras, block = BK.row_step_parts(net, X.data, 128, nu, shared, serial)
        if not SEPARATE_STEPS:
            opt.step_batch_rows(net.W, net.B, first, extras, block)
            tick("row steps (first layer, extras, block)", t)
            continue
        if first[1]:
            opt.step_first(net.W, *first)
        t = tick("first layer's rows step", t)
        opt.step_output(net.W, net.B, *extras)
        t = tick("extras' rows step", t)
        opt.step_block(net.W, net.B, *block)
        tick("block rows step", t)
    return T


if __name__ == "__main__":
    main()
