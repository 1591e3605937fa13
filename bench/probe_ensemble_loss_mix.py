"""Probe (one question, removed after it was answered): does a two-member ensemble gain from
members that differ in their loss (softmax and softmax_each) over members that differ in their
seed alone? Usage: probe_ensemble_loss_mix.py NAME SEEDS TRAIN TEST (one JSON line a seed)."""
import json, sys, time
import numpy as np
import slide
from slide import metrics
from slide.data import read_xc
from slide.ensemble import SlideEnsemble, member_seed

name, seeds = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
X, Y = read_xc(sys.argv[3])
Xt, Yt = read_xc(sys.argv[4])
inv = metrics.inverse_propensity(Y)
slide.SlideClassifier(random_state=0, loss="softmax_each").fit(X[:3000], Y[:3000])  # compile
for seed in seeds:
    t0 = time.perf_counter()
    a = slide.SlideClassifier(random_state=member_seed(seed, 0)).fit(X, Y)
    b = slide.SlideClassifier(random_state=member_seed(seed, 1), loss="softmax_each").fit(X, Y)
    ens = SlideEnsemble(n_models=2, random_state=seed)
    ens.seed_ = seed
    ens._set_members([a, b])
    secs = a.train_seconds_ + b.train_seconds_
    res = metrics.evaluate(Yt, ens.predict_topk(Xt, k=5), ks=(1, 5), inv_propensity=inv)
    rb = metrics.evaluate(Yt, b.predict_topk(Xt, k=5), ks=(1,), inv_propensity=inv)
    print(json.dumps({"set": name, "seed": seed, "train_s": round(secs, 1),
                      "P@1": round(float(res["P@1"]), 4), "P@5": round(float(res["P@5"]), 4),
                      "PSP@5": round(float(res["PSP@5"]), 4),
                      "member_softmax_each_P@1": round(float(rb["P@1"]), 4)}), flush=True)
