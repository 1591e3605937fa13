"""Offline study of the output layer's active set (issue 14).

Trains a model with today's defaults on a generated xc200k-shaped set (``--scale``), then, on its
FROZEN arrays and a sample of training rows, compares ways to pick the non-label part of the
active set at equal size m (``--sizes``):

  freq        m negatives drawn by label frequency (q ~ count + 1; today's sampler="random")
  dwta-today  the trained model's own index (DWTA K=6 L=50, vanilla sampler, up to m/2 ids),
              the rest frequency negatives
  simhash-wb  SimHash over [w_j ; b_j], queried with [h ; 1]; K from N and m, top-k by collision
              count (m/2), the rest frequency negatives
  dwta-wb     DWTA over [w_j ; b_j], queried with [h ; 1]; same budget rule
  mips        Simple-LSH (asymmetric MIPS): index [w_j ; b_j]/M augmented with
              sqrt(1 - |.|^2), query [h ; 1]/|[h ; 1]| with 0; SimHash, top-k (m/2) + freq
  label-q     the mips index queried with the true label's own vector (Daghaghi et al. 2021)
  oracle      the exact top-m logits (the upper bound at this size)

For each: captured softmax mass, recall of the true top-32 logits, candidate count, query cost
(microseconds per sample, hashing + sampling in the engine's batch kernels, same run). Then the
sampled-softmax normaliser (engine vs the unbiased fix) and the code drift between checkpoints.

    flock /tmp/slide-bench.lock python bench/lsh_study.py --scale 0.25 --out bench/results/lsh_study.json
"""
import argparse
import json
import math
import time

import numpy as np
from numba import njit, prange

import slide
from slide.network import diagnostics as dg
from slide.estimator import SlideClassifier
from slide.kernels.lsh.hashes import hash_dense_batch
from slide.kernels.lsh.index import LSHIndex
from slide.kernels.lsh.samplers import sample_batch


@njit(cache=True, nogil=True, parallel=True)
def collide_rerank(codes, offsets, items, W, b, H, n_cand, n_keep, allowed):
    """Per row: count each neuron's collisions with the query over the L tables, keep the
    ``n_cand`` most-colliding neurons (``allowed`` ones only), score those exactly (w.h + b)
    and return the ``n_keep`` best (ids, -1 padded; their scores) and the distinct candidates seen."""
    n_rows, L = codes.shape
    out = np.full((n_rows, n_keep), -1, np.int64)
    out_s = np.full((n_rows, n_keep), -np.inf, np.float32)
    seen_n = np.zeros(n_rows, np.int64)
    for i in prange(n_rows):
        count = np.zeros(W.shape[0], np.int32)
        touched = np.empty(W.shape[0], np.int64)
        nt = 0
        for t in range(L):
            c = codes[i, t]
            for p in range(offsets[t, c], offsets[t, c + 1]):
                j = items[t, p]
                if not allowed[j]:
                    continue
                if count[j] == 0:
                    touched[nt] = j
                    nt += 1
                count[j] += 1
        seen_n[i] = nt
        cand = touched[:nt]
        if nt > n_cand:
            cnt = np.empty(nt, np.int32)
            for a in range(nt):
                cnt[a] = -count[cand[a]]
            cand = cand[np.argsort(cnt, kind="mergesort")[:n_cand]]
        s = np.empty(cand.shape[0], np.float32)
        for a in range(cand.shape[0]):
            j = cand[a]
            acc = b[j]
            for d in range(H.shape[1]):
                acc += W[j, d] * H[i, d]
            s[a] = acc
        top = np.argsort(-s)[:n_keep]
        for a in range(top.shape[0]):
            out[i, a] = cand[top[a]]
            out_s[i, a] = s[top[a]]
    return out, out_s, seen_n


def load(args):
    """(X, Y, Xt, Yt, description): an XC file pair, or a generated preset (--n-train rows)."""
    if args.train:
        from slide.data import read_xc
        X, Y = read_xc(args.train)
        Xt, Yt = read_xc(args.test)
        return X, Y, Xt, Yt, args.train
    over = {k: v for k, v in (("n_train", args.n_train), ("n_test", args.test_rows)) if v}
    X, Y, Xt, Yt = slide.generate(args.preset, scale=args.scale, seed=args.seed, **over)
    return X, Y, Xt, Yt, f"{args.preset} scale {args.scale}" + (
        f" n_train {args.n_train}" if args.n_train else "")


def train(args, X, Y):
    snaps = {}

    def cb(model, info):
        if info["batch"] in args.snap_batches:
            snaps[info["batch"]] = dg.current_codes(model)
        return info["batch"] >= args.max_batches

    model = SlideClassifier(hidden_sizes=(args.hidden,), learning_rate=args.lr,
                            epochs=args.epochs, random_state=args.seed, n_threads=args.threads,
                            neighbours=0)   # the study is about the network's tables
    t0 = time.perf_counter()
    model.fit(X, Y, callback=cb)
    secs = time.perf_counter() - t0
    return model, snaps, secs


def freq_negatives(q, m, exclude, rng):
    """m distinct ids drawn by q, not in ``exclude`` (sequential draws, deduplicated)."""
    got = []
    seen = set(int(e) for e in exclude)
    while len(got) < m:
        for j in rng.choice(q.shape[0], 2 * (m - len(got)) + 8, p=q).tolist():
            if j not in seen:
                seen.add(j)
                got.append(j)
                if len(got) == m:
                    break
    return np.asarray(got, np.int64)


def budget_K(n, m, bits=1):
    """Hash bits per table so that one table's bucket holds about m/4 neurons: each table then
    contributes a quarter of the budget and top-k by collisions over L tables has >= 4x m
    distinct candidates to rank (BOLT sizes its tables from N and the target the same way)."""
    return max(1, int(round(math.log2(max(2.0, n / max(1.0, m / 4))) / bits)))


def lsh_select(index, Q, budget, sampler, labels_list, seed=0):
    """(selected ids per row (labels dropped), distinct candidates per row, us/row); the
    kernels are warmed up on two rows first so the time excludes compilation."""
    hash_dense_batch(index.hf, Q[:2])
    sample_batch(sampler, hash_dense_batch(index.hf, Q[:2]), index.offsets, index.items,
                 index.n_neurons, budget, 1, forced=labels_list[:2], seed=seed)
    t0 = time.perf_counter()
    codes = hash_dense_batch(index.hf, Q)
    out, counts = sample_batch(sampler, codes, index.offsets, index.items, index.n_neurons,
                               budget, 1, forced=labels_list, seed=seed)
    us = (time.perf_counter() - t0) / Q.shape[0] * 1e6
    sel = [out[i, len(np.unique(labels_list[i])):counts[i]].astype(np.int64)
           for i in range(Q.shape[0])]
    cand = [len(np.unique(np.concatenate([index.bucket(t, codes[i, t]) for t in range(index.L)])))
            for i in range(min(Q.shape[0], 64))]
    return sel, float(np.mean(cand)), us


def rerank_select(index, Q, Wo, bo, H, n_cand, n_keep, allowed, labels_list):
    """collide_rerank picks per row (labels dropped), mean distinct candidates, us/row."""
    args = (index.offsets, index.items, Wo, bo)
    collide_rerank(hash_dense_batch(index.hf, Q[:2]), *args, H[:2], n_cand, n_keep, allowed)
    t0 = time.perf_counter()
    codes = hash_dense_batch(index.hf, Q)
    out, _, seen = collide_rerank(codes, *args, H, n_cand, n_keep + 8, allowed)
    us = (time.perf_counter() - t0) / Q.shape[0] * 1e6
    sel = [o[(o >= 0) & ~np.isin(o, lab)][:n_keep]
           for o, lab in zip(out, labels_list)]
    return sel, float(seen.mean()), us


def evaluate(Z, labels_list, picks):
    """Mean captured mass and top-32 recall of labels U picks[i]."""
    mass, rec = [], []
    for i in range(Z.shape[0]):
        act = np.unique(np.concatenate([labels_list[i], picks[i]]))
        mass.append(dg.captured_mass(Z[i], act))
        rec.append(dg.topk_recall(Z[i], act, 32))
    return float(np.mean(mass)), float(np.mean(rec))


def compare(model, Xs, labels_list, sizes, q, seed):
    net = model.network_
    Wo, bo = net.output_view()
    n = Wo.shape[0]
    H = net.hidden(Xs)
    t0 = time.perf_counter()
    Z = dg.full_logits(net, Xs)
    dense_us = (time.perf_counter() - t0) / Xs.shape[0] * 1e6
    WB = np.hstack([Wo, bo[:, None]]).astype(np.float32)
    HB = np.hstack([H, np.ones((H.shape[0], 1), np.float32)])
    norms = np.linalg.norm(WB, axis=1)
    M = norms.max()
    WM = np.hstack([WB / M, np.sqrt(np.maximum(0, 1 - (norms / M) ** 2))[:, None]])
    HM = np.hstack([HB / np.linalg.norm(HB, axis=1, keepdims=True), np.zeros((H.shape[0], 1))])
    WM, HM = WM.astype(np.float32), HM.astype(np.float32)
    YQ = np.stack([WM[lab[0]] * np.array([1] * (WM.shape[1] - 1) + [0], np.float32)
                   / max(1e-12, np.linalg.norm(WM[lab[0], :-1])) for lab in labels_list])
    rng = np.random.default_rng(seed)
    rows = []
    for m in sizes:
        half = m // 2
        fq = [freq_negatives(q, m, lab, rng) for lab in labels_list]
        rows.append(dict(m=m, method="freq", cand=0, us=0.0,
                         **dict(zip(("mass", "recall"), evaluate(Z, labels_list, fq)))))
        idx = net.indices[net.layout.n_layers - 1]
        sel, cand, us = lsh_select(idx, H, half, "vanilla", labels_list, seed)
        rows.append(_mixed("dwta-today", m, sel, cand, us, Z, labels_list, q, rng))
        K = budget_K(n, m)
        designs = [("simhash-wb", "simhash", WB, HB, K), ("dwta-wb", "dwta", WB, HB,
                                                            max(1, K // 3)),
                   ("mips", "simhash", WM, HM, K), ("label-q", "simhash", WM, YQ, K)]
        built = {}
        for name, fam, Wx, Qx, k in designs:
            key = (fam, id(Wx) if name != "label-q" else id(WM), k)
            if key not in built:
                L = 16
                ix = LSHIndex(fam, Wx.shape[1], k, L, max(k * (3 if fam == "dwta" else 1), 1),
                              bucket_size=max(4 * m, 1024), seed=seed + 1)
                ix.build(np.ascontiguousarray(Wx))
                built[key] = ix
            ix = built[key]
            sel, cand, us = lsh_select(ix, np.ascontiguousarray(Qx), half, "topk", labels_list,
                                       seed)
            r = _mixed(name, m, sel, cand, us, Z, labels_list, q, rng)
            r.update(K=k, L=ix.L)
            rows.append(r)
        # candidates by collision count over L tables of small K (large buckets), re-ranked
        # by the exact logit w.h + b: the m/2 best of the 2m most-colliding neurons (rerank:
        # all labels; tail-rerank: only labels outside the m most frequent, which the
        # frequency draw cannot reach)
        k_rr = max(2, K - 2)
        ix = LSHIndex("simhash", WM.shape[1], k_rr, 16, k_rr, bucket_size=n, seed=seed + 2)
        ix.build(np.ascontiguousarray(WM))
        head = np.argsort(-q, kind="stable")[:m]
        tail_ok = np.ones(n, np.bool_)
        tail_ok[head] = False
        for name, allowed in (("rerank", np.ones(n, np.bool_)), ("tail-rerank", tail_ok)):
            sel, cand, us = rerank_select(ix, HM, Wo, bo, H, 2 * m, half, allowed, labels_list)
            r = _mixed(name, m, sel, cand, us, Z, labels_list, q, rng)
            r.update(K=k_rr, L=16)
            rows.append(r)
        orc = []
        for i, lab in enumerate(labels_list):
            z = Z[i].copy()
            z[lab] = -np.inf
            orc.append(np.argpartition(-z, m - 1)[:m])
        rows.append(dict(m=m, method="oracle", cand=n, us=dense_us,
                         **dict(zip(("mass", "recall"), evaluate(Z, labels_list, orc)))))
    return rows, Z


def _mixed(name, m, sel, cand, us, Z, labels_list, q, rng):
    """LSH picks, then frequency negatives up to m non-label ids."""
    picks = []
    n_lsh = []
    for i, s in enumerate(sel):
        s = s[:m]
        n_lsh.append(len(s))
        extra = freq_negatives(q, m - len(s), np.concatenate([labels_list[i], s]), rng)
        picks.append(np.concatenate([s, extra]))
    mass, rec = evaluate(Z, labels_list, picks)
    return dict(m=m, method=name, cand=cand, us=us, lsh=float(np.mean(n_lsh)), mass=mass,
                recall=rec)


def normaliser_study(model, Xs, labels_list, Z, n_serials=5):
    """Engine estimate vs exact vs the reference unbiased estimate of sum_j exp(z_j)
    (``normaliser_fixed``; the engine uses the same rule since issue 14's fix)."""
    net = model.network_
    log_inc = dg.shared_log_inclusion(net)
    H = net.hidden(Xs)
    eng, fix, lsh_share = [], [], []
    for serial in range(1, n_serials + 1):
        shared = dg.shared_negatives(model, 10_000 + serial)
        for i, lab in enumerate(labels_list):
            lab = np.sort(lab).astype(np.int32)
            ids, src = dg.active_set(model, H[i], lab, shared, 10_000 + serial, i)
            zc = Z[i] - Z[i].max()
            exact = np.exp(zc).sum()
            eng.append(dg.normaliser_engine(zc, ids, dg.engine_log_offsets(net, ids, src,
                                                                             log_inc)) / exact)
            # C: labels + the LSH ids, chosen without looking at the draw (the engine's
            # layout since issue 14's fix, so engine and fixed agree without a fill)
            fix.append(dg.normaliser_fixed(zc, ids[src <= dg.SOURCE_LSH], shared, log_inc)
                       / exact)
            lsh_share.append(np.exp(zc[ids[src == dg.SOURCE_LSH]]).sum() / exact)
    def f(a):
        return dict(mean=float(np.mean(a)), median=float(np.median(a)),
                    mean_log=float(np.mean(np.log(a))), std=float(np.std(a)))
    return dict(engine=f(eng), fixed=f(fix), lsh_mass=float(np.mean(lsh_share)))


def _recall5(approx, exact):
    return float(np.mean([len(np.intersect1d(a[a >= 0], e)) / e.shape[0]
                          for a, e in zip(approx, exact)]))


def serving(model, Xt, Yt, n_cand_list, seed, Ks=(4, 6, 8), k=5):
    """Sparse serving vs exact top-k on test rows: recall of the exact top-k and the speed
    ratio (exact seconds / method seconds, same run, each timed after a warm-up call).
    Methods: the engine's predict_topk(exact=False) with prior_candidates 0 and 256, and the
    collision-count + exact re-rank prototype (SimHash over the MIPS-augmented [w; b], K
    small, L 16; the C most-colliding neurons plus the 256 highest-bias labels scored
    exactly)."""
    from slide.metrics import evaluate as ev
    net = model.network_
    Xt = Xt.copy()
    Xt.indptr = Xt.indptr.astype(np.int64)

    def timed(f):
        f(Xt[:64])
        t0 = time.perf_counter()
        out = f(Xt)
        return out, time.perf_counter() - t0

    exact, t_exact = timed(lambda X: model.predict_topk(X, k=k))
    res = [dict(method="exact", recall=1.0, speedup=1.0, seconds=t_exact,
                P1=ev(Yt, exact, ks=(1,))["P@1"])]
    for prior in (0, 256):
        top, t = timed(lambda X: model.predict_topk(X, k=k, exact=False,
                                                    prior_candidates=prior))
        res.append(dict(method=f"engine sparse, prior {prior}", recall=_recall5(top, exact),
                        speedup=t_exact / t, seconds=t, P1=ev(Yt, top, ks=(1,))["P@1"]))
    Wo, bo = net.output_view()
    n = Wo.shape[0]
    WB = np.hstack([Wo, bo[:, None]]).astype(np.float32)
    norms = np.linalg.norm(WB, axis=1)
    WM = np.hstack([WB / norms.max(), np.sqrt(np.maximum(0, 1 - (norms / norms.max()) ** 2))
                    [:, None]]).astype(np.float32)
    prior = net.prior_ids(256).astype(np.int64)
    allowed = np.ones(n, np.bool_)
    allowed[prior] = False
    Wp, bp = np.ascontiguousarray(Wo[prior]), bo[prior]
    for K in Ks:
        ix = LSHIndex("simhash", WM.shape[1], K, 16, K, bucket_size=n, seed=seed + 3)
        ix.build(np.ascontiguousarray(WM))
        for C in n_cand_list:
            def proto(X):
                H = net.hidden(X)
                HM = np.hstack([H, np.ones((H.shape[0], 1), np.float32)])
                HM /= np.linalg.norm(HM, axis=1, keepdims=True)
                HM = np.hstack([HM, np.zeros((H.shape[0], 1), np.float32)])
                ids, sc, _ = collide_rerank(hash_dense_batch(ix.hf, HM), ix.offsets, ix.items,
                                            Wo, bo, H, C, k, allowed)
                ps = H @ Wp.T + bp
                all_ids = np.hstack([ids, np.broadcast_to(prior, (H.shape[0], prior.shape[0]))])
                all_s = np.hstack([sc, ps])
                o = np.argsort(-all_s, axis=1)[:, :k]
                return np.take_along_axis(all_ids, o, 1)
            top, t = timed(proto)
            res.append(dict(method=f"collide-rerank K {K} C {C} + prior 256",
                            recall=_recall5(top, exact), speedup=t_exact / t, seconds=t,
                            P1=ev(Yt, top, ks=(1,))["P@1"]))
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="xc200k")
    ap.add_argument("--scale", type=float, default=0.25)
    ap.add_argument("--n-train", type=int, default=None, help="override the preset's points")
    ap.add_argument("--train", default=None, help="XC train file (with --test)")
    ap.add_argument("--test", default=None)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--test-rows", type=int, default=2000)
    ap.add_argument("--serve-cands", type=int, nargs="*", default=[1024, 4096],
                    help="candidates C of the re-rank serving prototype (none: skip serving)")
    ap.add_argument("--serve-K", type=int, nargs="+", default=[4, 6, 8])
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--max-batches", type=int, default=10**9)
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--snap-batches", type=int, nargs="+", default=[50, 100, 150, 190])
    ap.add_argument("--norm-serials", type=int, default=20,
                    help="shared-negative draws per row in the normaliser check")
    ap.add_argument("--out", default="bench/results/lsh_study.json")
    args = ap.parse_args(argv)
    if bool(args.train) != bool(args.test):
        ap.error("--train and --test go together")
    X, Y, Xt, Yt, data = load(args)
    Xt, Yt = Xt[:args.test_rows], Yt[:args.test_rows]
    model, snaps, secs = train(args, X, Y)
    res = dict(data=data, scale=args.scale, n_labels=int(Y.shape[1]), n_train=int(X.shape[0]),
               n_features=int(X.shape[1]), epochs=args.epochs, lr=args.lr, hidden=args.hidden,
               batches=model.batches_, train_seconds=secs,
               p_at_1=float(model.score(Xt, Yt)))
    print(f"trained {res['n_labels']} labels, {res['n_train']} rows, {model.batches_} batches"
          f" in {secs:.0f} s; P@1 {res['p_at_1']:.3f}", flush=True)
    rows = np.sort(np.random.default_rng(args.seed).permutation(X.shape[0])[:args.rows])
    Xs = X[rows]
    Xs.indptr = Xs.indptr.astype(np.int64)
    labels_list = [Y.indices[Y.indptr[r]:Y.indptr[r + 1]].astype(np.int64) for r in rows]
    counts = np.bincount(Y.indices, minlength=Y.shape[1]).astype(np.float64)
    q = (counts + 1.0) ** model.negative_power
    q /= q.sum()
    res["diagnostics"] = dg.diagnose(model, X, Y, n_rows=args.rows, seed=args.seed)
    print(dg.format_diagnostics(res["diagnostics"]), flush=True)
    res["compare"], Z = compare(model, Xs, labels_list, args.sizes, q, args.seed)
    for r in res["compare"]:
        print(f"m={r['m']:5d} {r['method']:11s} mass {r['mass']:.3f} recall@32 "
              f"{r['recall']:.3f} cand {r['cand']:8.0f} lsh {r.get('lsh', 0):6.0f} "
              f"us/sample {r['us']:8.1f}", flush=True)
    res["normaliser"] = dg_norm = normaliser_study(model, Xs[:100], labels_list[:100], Z[:100],
                                                 args.norm_serials)
    print("normaliser Zhat/Z:", json.dumps(dg_norm), flush=True)
    keys = sorted(snaps)
    res["drift"] = [dict(a=a, b=b, **dg.codes_drift(snaps[a], snaps[b]))
                    for a, b in zip(keys, keys[1:])]
    res["drift_since_rehash"] = dg.code_drift(model)
    print("drift:", res["drift"], "since last rehash:", res["drift_since_rehash"], flush=True)
    if args.serve_cands:
        res["serving"] = serving(model, Xt, Yt, args.serve_cands, args.seed, args.serve_K)
        for r in res["serving"]:
            print(f"serve {r['method']:40s} recall@5 {r['recall']:.3f} P@1 {r['P1']:.3f} "
                  f"speedup {r['speedup']:6.1f}x", flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
