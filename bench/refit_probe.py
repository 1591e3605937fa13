"""Probe (one question; removed once its result is written down): does the network retrained
on every row (the re-ranker's held-out tenth included), after the ranking stages were fitted on
the first network, raise the whole model's accuracy? Paired per seed: the default fit, then the
same model with the second network in place of the first and its neighbour memory rebuilt.

    python bench/refit_probe.py TRAIN TEST 0,1,2 [E [all|fit]]   (one JSON line a seed)

With E: instead of a second network, the first one trained E more epochs over every row (its
cosine schedule stretched to the new end), the re-ranker kept, the memory rebuilt; with "fit",
the control: the E more epochs over the network's own rows only (the held-out tenth still out);
with "within", the schedule's last E epochs (not more) run over every row: a second default fit
stopped E epochs before its end, its ranking stages fitted there, then trained to the end.
"""
import json
import sys
import time

import slide
from slide import metrics
from slide.data.inputs import cap_row_labels

train, test, seeds = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3].split(",")]
more_epochs = int(sys.argv[4]) if len(sys.argv) > 4 else 0
more_rows = sys.argv[5] if len(sys.argv) > 5 else "all"
Xtr, Ytr = slide.read_xc(train)
Xte, Yte = slide.read_xc(test)
inv = metrics.inverse_propensity(Ytr)


def score(model):
    t0 = time.perf_counter()
    top = model.predict_topk(Xte, k=5)
    m = metrics.evaluate(Yte, top, ks=(1, 5), inv_propensity=inv)
    return {"P@1": round(m["P@1"], 4), "P@5": round(m["P@5"], 4), "PSP@5": round(m["PSP@5"], 4),
            "predict_s": round(time.perf_counter() - t0, 1)}


def within(seed, last_epochs):
    """A default fit whose last ``last_epochs`` epochs run over every row, after its ranking
    stages were fitted (its train_seconds_ covers all of it)."""
    model = slide.SlideClassifier(random_state=seed)
    n_epochs = model.planned_batches(Xtr.shape[0], Ytr.shape[1])[0]
    stop = n_epochs - last_epochs
    model.fit(Xtr, Ytr, callback=lambda m, info: m.epoch_ >= stop)
    Ycap = cap_row_labels(Ytr, model.max_row_labels, model.seed_)
    print(f"seed {seed}: stopped at epoch {model.epoch_} + {model.batch_in_epoch_} batches "
          f"of {n_epochs} epochs", flush=True)
    t0 = time.perf_counter()
    model._build_memory(Xtr, Ycap, model._rerank_split(Xtr.shape[0], Ytr.shape[1]))
    model.train_seconds_ += time.perf_counter() - t0      # _train counts its own seconds
    reranker = model.rank_.reranker
    model._train(Xtr, Ycap, n_epochs, None, None, rows=None)
    model.rank_.reranker = reranker
    return model


for seed in seeds:
    A = slide.SlideClassifier(random_state=seed).fit(Xtr, Ytr)
    base, first_s = score(A), A.train_seconds_
    Ycap = cap_row_labels(Ytr, A.max_row_labels, A.seed_)
    if more_rows == "within":
        A = within(seed, more_epochs)
        second_s = A.train_seconds_
    elif more_epochs:
        reranker, t0 = A.rank_.reranker, time.perf_counter()
        end = A.epoch_ + more_epochs
        A.epochs = end
        rows = None if more_rows == "all" else \
            A._rerank_split(Xtr.shape[0], Ytr.shape[1])[0]
        A._train(Xtr, Ycap, end, None, None, rows=rows)
        A.rank_.reranker = reranker
        second_s = time.perf_counter() - t0
    else:
        B = slide.SlideClassifier(random_state=seed, rerank=False, neighbours=0).fit(Xtr, Ytr)
        A.network_ = B.network_
        second_s = B.train_seconds_
    t0 = time.perf_counter()
    A.fit_neighbours(Xtr, Ycap)
    mem_s = time.perf_counter() - t0
    refit = score(A)
    print(json.dumps({"seed": seed, "A_train_s": round(first_s, 1),
                      "second_network_s": round(second_s, 1), "memory_s": round(mem_s, 1),
                      "base": base, "refit": refit}), flush=True)
