"""Does the first layer need dense Adam's trajectory? The default optimizer ("adam") gives every
row the zero-gradient steps it missed since its last touch (``slide.network.adam``: the
catch-up, a second sqrt/divide pass over the row); in the batched engine's first layer that
pass is ~0.3 of the 1.7 ms its update takes a batch at 670k labels. This probe trains slide's
network alone (today's defaults, ``neighbours=0, rerank=False``, Adam lr 1e-3 constant) with
and without the catch-up in the first layer only (lazy Adam there: ``SparseOptimizer.step_first``
given no step records; the output layer keeps its catch-up), 3 seeds, and prints one JSON line
per run: fit seconds, P@1 and P@5 on the test set.

    python bench/probes/probe_lazy_first_layer.py [--data debdeps,debcontents,xc200k]
        [--seeds 0,1,2] [--out bench/results/lazy_first_layer.jsonl]

debdeps and debcontents are read from ``datasets/<name>/{train,test}.txt`` (2 epochs); xc200k
is the synthetic preset (100,000 training points, 5,000 test points, 1 epoch). Each seed
shuffles the training set and seeds the model; both variants of a seed see the same order.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _lazy_first_layer(on):
    """Patch ``SparseOptimizer.step_first`` to pass no step records (lazy Adam in the first
    layer) when ``on``; returns the original to restore."""
    from slide.network import optim
    from slide.network.row_steps import first_layer_step
    orig = optim.SparseOptimizer.step_first
    if not on:
        return orig

    def step_first(self, W, frows, n_uniq, x_val, dels):
        lay = self.layout
        first_layer_step(W, self.MW, self.VW, self.TW[:0], self._hyper(),
                         optim.KIND_ADAM if self._adam else optim.KIND_SGD,
                         int(lay.w_off[0]), frows, n_uniq, x_val, dels)

    optim.SparseOptimizer.step_first = step_first
    return orig


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="debdeps,debcontents,xc200k")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", default=None, help="append the JSON lines here too")
    args = ap.parse_args()
    import slide
    from bench.common import git_commit
    from slide.metrics import precision_at_k
    from slide.network import optim
    for data in args.data.split(","):
        if data == "xc200k":
            X0, Y0, Xt, Yt = slide.synthetic.generate("xc200k", seed=0, n_train=100000,
                                                      n_test=5000)
            epochs = 1
        else:
            X0, Y0 = slide.read_xc(f"datasets/{data}/train.txt")
            Xt, Yt = slide.read_xc(f"datasets/{data}/test.txt")
            epochs = 2
        for seed in (int(s) for s in args.seeds.split(",")):
            perm = np.random.default_rng(seed).permutation(X0.shape[0])
            X, Y = X0[perm], Y0[perm]
            kw = dict(learning_rate=1e-3, lr_schedule="constant", epochs=epochs, n_threads=2,
                      random_state=seed, neighbours=0, rerank=False)
            for lazy in (False, True):
                orig = _lazy_first_layer(lazy)
                try:
                    slide.SlideClassifier(**dict(kw, epochs=1)).fit(X[:2048], Y[:2048])
                    m = slide.SlideClassifier(**kw)
                    t = time.perf_counter()
                    m.fit(X, Y)
                    dt = time.perf_counter() - t
                finally:
                    optim.SparseOptimizer.step_first = orig
                top = np.asarray(m.predict_topk(Xt, k=5, exact=True))
                rec = {"commit": git_commit(), "data": data, "seed": seed,
                       "first_layer": "lazy" if lazy else "adam (catch-up)",
                       "fit_s": round(dt, 2), "p1": round(float(precision_at_k(Yt, top, 1)), 4),
                       "p5": round(float(precision_at_k(Yt, top, 5)), 4)}
                line = json.dumps(rec)
                print(line, flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(line + "\n")


if __name__ == "__main__":
    main()
