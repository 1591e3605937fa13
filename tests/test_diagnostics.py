"""slide.engine.diagnostics against the training kernel and against brute-force computations."""
import numpy as np
import pytest
import scipy.sparse as sp

import slide
from slide.engine import diagnostics as dg
from slide.estimator import SlideClassifier


def _fit(**kw):
    X, Y, Xt, Yt = slide.generate("tiny", seed=3)
    params = dict(hidden_sizes=(16,), K=2, L=8, range_pow=6, bucket_size=16, sampler_budget=24,
                  shared_negatives=20, batch_size=64, epochs=1, learning_rate=1e-2,
                  random_state=5, n_threads=1, sampler="vanilla")
    params.update(kw)
    return SlideClassifier(**params).fit(X, Y), X, Y


@pytest.mark.parametrize("kw", [
    dict(),                                                    # vanilla + frequency negatives
    dict(sampler="topk", min_active=70),                       # top-k, random padding
    dict(sampler="threshold", sampler_threshold=2, negative_power=0.0),
    dict(sampler="random", min_active=60),                     # no LSH: labels + shared + fill
    dict(shared_negatives=0, min_active=40),                   # LSH only (SLIDE as published)
])
def test_active_set_matches_the_training_kernel(kw):
    model, X, Y = _fit(**kw)
    net = model.network_
    for r in (0, 7, 31):
        xi = X.indices[X.indptr[r]:X.indptr[r + 1]]
        xv = X.data[X.indptr[r]:X.indptr[r + 1]]
        lab = np.sort(Y.indices[Y.indptr[r]:Y.indptr[r + 1]])
        _, _, _, act = model.sample_loss_and_grads(xi, xv, lab, return_active=True)
        want = act[-1]
        row = sp.csr_matrix(X[r])
        row.indptr = row.indptr.astype(np.int64)
        h = net.hidden(row)[0]
        shared = dg.shared_negatives(model, 1)
        ids, src = dg.active_set(model, h, lab, shared, serial=1, position=0)
        np.testing.assert_array_equal(ids, want)
        # the source layout: labels, LSH (together C), shared negatives not in C, padding
        assert (src[:len(lab)] == dg.SOURCE_LABEL).all()
        assert np.all(np.diff(src) >= 0)
        in_c = ids[src <= dg.SOURCE_LSH]
        n_sh = np.count_nonzero(~np.isin(shared, in_c)) if len(shared) else 0
        assert (src == dg.SOURCE_SHARED).sum() == n_sh
        assert set(shared.tolist()) <= set(ids.tolist())
        if model.sampler == "random" or model.shared_negatives == 0:
            assert (src == dg.SOURCE_SHARED).sum() == n_sh
        if model.sampler == "random":
            assert (src == dg.SOURCE_LSH).sum() == 0
        if kw.get("min_active"):
            assert len(ids) >= min(kw["min_active"], model.n_labels_)


def test_active_set_sources_are_what_they_claim():
    model, X, Y = _fit(min_active=90)
    net = model.network_
    row = sp.csr_matrix(X[4])
    row.indptr = row.indptr.astype(np.int64)
    h = net.hidden(row)[0]
    lab = np.sort(Y.indices[Y.indptr[4]:Y.indptr[5]])
    shared = dg.shared_negatives(model, 3)
    ids, src = dg.active_set(model, h, lab, shared, serial=3, position=2)
    assert len(np.unique(ids)) == len(ids)
    np.testing.assert_array_equal(np.sort(ids[src == dg.SOURCE_LABEL]), lab)
    in_c = set(ids[src <= dg.SOURCE_LSH].tolist())
    assert set(ids[src == dg.SOURCE_SHARED].tolist()) == set(shared.tolist()) - in_c
    # C does not depend on the shared draw: the same query without shared negatives picks
    # the same labels + LSH ids
    ids0, src0 = dg.active_set(model, h, lab, np.zeros(0, np.int32), serial=3, position=2)
    np.testing.assert_array_equal(ids0[src0 <= dg.SOURCE_LSH], ids[src <= dg.SOURCE_LSH])
    # every LSH id lies in one of the query's buckets
    cand = set(net.indices[1].candidates(h).tolist())
    assert set(ids[src == dg.SOURCE_LSH].tolist()) <= cand
    assert (src == dg.SOURCE_LSH).sum() <= model.sampler_budget
    assert len(ids) == 90


def test_mass_and_recall_against_brute_force():
    rng = np.random.default_rng(0)
    z = rng.normal(size=300) * 3
    active = rng.choice(300, 40, replace=False)
    p = np.exp(z) / np.exp(z).sum()
    assert dg.captured_mass(z, active) == pytest.approx(p[active].sum(), rel=1e-12)
    assert dg.captured_mass(z, np.arange(300)) == pytest.approx(1.0)
    top = np.argsort(-z)[:32]
    want = np.mean([t in set(active.tolist()) for t in top])
    assert dg.topk_recall(z, active, 32) == pytest.approx(want)
    assert dg.topk_recall(z, top[:16], 32) == pytest.approx(0.5)
    assert dg.source_counts(np.array([0, 0, 1, 2, 2, 2, 3], np.int8)) == \
        {"labels": 2, "lsh": 1, "shared": 3, "padding": 1}


def test_full_logits_are_the_exact_network():
    model, X, Y = _fit()
    Xs = X[:10]
    Z = dg.full_logits(model, Xs)
    np.testing.assert_allclose(Z, model.predict_scores(Xs), rtol=1e-4, atol=1e-4)


def test_code_drift_counts_changed_neurons():
    model, X, Y = _fit()
    net = model.network_
    net.rebuild(model.batches_)      # tables now hold the current codes: no drift
    d0 = dg.code_drift(model)
    assert d0 == {"neurons": 0.0, "codes": 0.0}
    before = dg.current_codes(model)
    stored = dg.stored_codes(net.indices[1])
    known = stored >= 0
    np.testing.assert_array_equal(stored[known], before[known])
    # move 25 neurons far away: at least those may change, no other one can
    Wo, _ = net.output_view()
    moved = np.arange(0, 200, 8)
    Wo[moved] = np.random.default_rng(1).normal(size=(len(moved), Wo.shape[1])) * 5
    after = dg.current_codes(model)
    changed = (after != before).any(axis=1)
    assert not changed[np.setdiff1d(np.arange(200), moved)].any()
    d = dg.code_drift(model)
    assert d["neurons"] == pytest.approx(changed[known.any(axis=1)].mean())
    assert 0 < d["neurons"] <= len(moved) / 200 + 1e-9
    assert dg.codes_drift(before, after)["codes"] == pytest.approx((after != before).mean())
    with pytest.raises(ValueError, match="shape"):
        dg.codes_drift(before, after[:5])


def test_fixed_normaliser_is_unbiased_and_the_old_rule_counted_lsh_twice():
    """Exact expectation over every ordered draw of the shared negatives on a tiny layer
    (8 neurons, 3 frequency draws: 512 sequences): the fixed estimator's mean is sum exp(z);
    the engine's rule before issue 14's fix (HT weight on every shared negative, the LSH ids
    chosen after them and counted exactly) exceeds it by sum over LSH ids j of
    exp(z_j) (1 - P(j drawn)), their mass counted a second time."""
    import itertools
    rng = np.random.default_rng(4)
    n, n_draws = 8, 3
    z = rng.normal(size=n) * 2
    q = rng.dirichlet(np.ones(n))
    log_inc = np.log(-np.expm1(n_draws * np.log1p(-q)))
    labels = np.array([3])
    lsh = np.array([5, 6])                 # chosen without looking at the draw
    exact = np.exp(z).sum()
    e_fixed = e_engine = 0.0
    for seq in itertools.product(range(n), repeat=n_draws):
        p = np.prod(q[list(seq)])
        S = np.unique(seq)
        e_fixed += p * dg.normaliser_fixed(z, np.concatenate([labels, lsh]), S, log_inc)
        sh = np.setdiff1d(S, labels)                      # the engine drops shared labels
        lsh_e = np.setdiff1d(lsh, sh)                     # forced first: LSH skips them
        ids = np.concatenate([labels, sh, lsh_e])
        src = np.array([0] * len(labels) + [1] * len(sh) + [2] * len(lsh_e), np.int8)
        off = np.zeros(len(ids))
        off[src == 1] = -log_inc[sh]
        e_engine += p * dg.normaliser_engine(z, ids, off)
    assert e_fixed == pytest.approx(exact, rel=1e-9)
    p_in = np.exp(log_inc[lsh])
    double = (np.exp(z[lsh]) * (1 - p_in)).sum()
    assert double > 0.01 * exact
    assert e_engine - exact == pytest.approx(double, rel=1e-9)


def test_engine_offsets_match_the_kernel_rule():
    model, X, Y = _fit(min_active=80, negative_power=1.0)
    net = model.network_
    log_inc = dg.shared_log_inclusion(net)
    n_out = int(net.n_out[-1])
    ids = np.arange(10, dtype=np.int32)
    # 1 label, 3 LSH ids (C), 2 shared ids outside C, 4 padding: 10 - 4 > 20 draws fails, so
    # the fill is not there for every draw and is left out of the estimate
    src = np.array([0, 1, 1, 1, 2, 2, 3, 3, 3, 3], np.int8)
    off = dg.engine_log_offsets(net, ids, src, log_inc)
    assert (off[:4] == 0).all()
    np.testing.assert_allclose(off[4:6], -log_inc[4:6], rtol=1e-6)
    assert np.isneginf(off[6:]).all()
    # a fill larger than the draw count (26 - 1 > 20): present for every draw, so each half
    # of the estimate gets weight 1/2 and the shared ids (1 + 1/pi) / 2
    ids = np.arange(26, dtype=np.int32)
    src = np.array([0, 2, 2] + [3] * 23, np.int8)
    off = dg.engine_log_offsets(net, ids, src, log_inc)
    assert off[0] == 0
    np.testing.assert_allclose(off[1:3], np.log(0.5 + 0.5 * np.exp(-log_inc[1:3])), rtol=1e-6)
    np.testing.assert_allclose(off[3:], np.log((n_out - 3) / 23) + np.log(0.5), rtol=1e-6)
    # no fill: pure Horvitz-Thompson on the shared ids outside C, C exact
    src = np.array([0, 1, 1] + [2] * 23, np.int8)
    off = dg.engine_log_offsets(net, ids, src, log_inc)
    assert (off[:3] == 0).all()
    np.testing.assert_allclose(off[3:], -log_inc[3:26], rtol=1e-6)
    # the kernel's shared weights are -log P(drawn) as SharedNegatives.draw stores them
    shared = dg.shared_negatives(model, 9)
    np.testing.assert_allclose(-log_inc[shared], net.negatives.corr[shared], rtol=1e-5)
    np.testing.assert_allclose(np.log(0.5 + 0.5 * np.exp(-log_inc[shared])),
                               net.negatives.corr_mix[shared], rtol=1e-5)
    # uniform negatives: shared ids outside C and the fill share U / |R| with U = n_out - |C|
    uni = _fit(min_active=80, negative_power=0.0)[0].network_
    off = dg.engine_log_offsets(uni, ids, src, dg.shared_log_inclusion(uni))
    assert (off[:3] == 0).all()
    np.testing.assert_allclose(off[3:], np.log((n_out - 3) / 23))


def test_diagnose_reports_all_measures():
    model, X, Y = _fit(min_active=50)
    d = dg.diagnose(model, X, Y, n_rows=40, seed=1)
    assert d["rows"] == 40
    assert 0 < d["mass"] <= 1 and 0 < d["recall"] <= 1
    s = d["sources"]
    assert s["labels"] > 0 and s["shared"] > 0
    assert sum(s.values()) == pytest.approx(d["active"])
    assert d["active"] >= 50
    assert d["drift"] is not None and 0 <= d["drift"]["neurons"] <= 1
    assert d["normaliser_ratio"] > 0
    assert "mass=" in dg.format_diagnostics(d)
    # the dense extreme: every neuron active holds all the mass
    full = _fit(sampler="random", min_active=200)[0]
    df = dg.diagnose(full, X, Y, n_rows=10)
    assert df["mass"] == pytest.approx(1.0) and df["recall"] == pytest.approx(1.0)
    assert df["drift"] is None


def test_bad_input_is_a_clear_error():
    model, X, Y = _fit()
    with pytest.raises(ValueError, match="n_rows"):
        dg.diagnose(model, X, Y, n_rows=0)
    with pytest.raises(ValueError, match="same"):
        dg.diagnose(model, X[:5], Y[:6])
    with pytest.raises(ValueError, match="fitted SlideClassifier"):
        dg.diagnose(object(), X, Y)
    hidden = SlideClassifier(hidden_sizes=(16,), sparse_layers=(0, 1), K=2, L=4, range_pow=6,
                             shared_negatives=0, random_state=0, n_threads=1).fit(X[:64], Y[:64])
    with pytest.raises(ValueError, match="sparse output layer only"):
        dg.diagnose(hidden, X, Y)


def test_active_sets_of_a_whole_batch_match_the_kernel():
    """Positions > 0 of a batch (their own random streams) and the batch's shared draw."""
    model, X, Y = _fit(sampler="topk", min_active=60)
    net = model.network_
    rows = np.arange(10, 26, dtype=np.int64)
    max_labels = int(np.diff(Y.indptr).max())
    Xc = sp.csr_matrix(X)
    Xc.indptr = Xc.indptr.astype(np.int64)
    Yc = sp.csr_matrix(Y)
    Yc.indptr = Yc.indptr.astype(np.int64)
    net.prepare(len(rows), 1, max_labels)
    serial = 77
    net.forward_backward(Xc, Yc, rows, model.seed_, serial)
    H = net.hidden(Xc[rows])
    shared = dg.shared_negatives(model, serial)
    a = int(net.sc.s_off[1])
    for s, r in enumerate(rows):
        lab = np.sort(Yc.indices[Yc.indptr[r]:Yc.indptr[r + 1]])
        ids, _ = dg.active_set(model, H[s], lab, shared, serial, s, max_labels)
        want = net.sc.ids[s, a:a + int(net.sc.n_act[s, 1])]
        np.testing.assert_array_equal(ids, want)


def test_every_logs_the_diagnostics_without_changing_training():
    X, Y, _, _ = slide.generate("tiny", seed=3)
    params = dict(hidden_sizes=(16,), K=2, L=8, range_pow=6, bucket_size=16, sampler_budget=24,
                  shared_negatives=20, min_active=50, batch_size=64, epochs=1,
                  learning_rate=1e-2, random_state=5, n_threads=1, sampler="vanilla")
    lines = []
    cb = dg.every(5, X, Y, n_rows=20, log=lines.append)
    model = SlideClassifier(**params).fit(X, Y, callback=cb)
    n_batches = model.batches_
    assert n_batches == 10          # 600 rows, batches of 64
    assert [b for b, _ in cb.history] == [5, 10]
    assert len(lines) == len(cb.history)
    for line, (b, d) in zip(lines, cb.history):
        assert line.startswith(f"batch {b}: ")
        for key in ("mass=", "recall@32=", "labels ", "shared ", "lsh ", "pad ", "drift="):
            assert key in line
        assert d["rows"] == 20 and 0 < d["mass"] <= 1 and 0 < d["recall"] <= 1
        assert d["active"] >= 50 and d["sources"]["lsh"] >= 0
        assert 0 <= d["drift"]["neurons"] <= 1
    # the last log is diagnose() of the final model on the next batch
    again = dg.diagnose(model, X, Y, n_rows=20, serial=n_batches + 1)
    assert again == cb.history[-1][1]
    # logging does not perturb training: the same fit without it gives the same weights
    plain = SlideClassifier(**params).fit(X, Y)
    np.testing.assert_array_equal(plain.network_.W, model.network_.W)
    np.testing.assert_array_equal(plain.network_.B, model.network_.B)
    with pytest.raises(ValueError, match="n_batches"):
        dg.every(0, X, Y)
    with pytest.raises(ValueError, match="n_rows"):
        dg.every(5, X, Y, n_rows=0)
    with pytest.raises(ValueError, match="same"):
        dg.every(5, X[:3], Y[:4])
    with pytest.raises(ValueError, match="log"):
        dg.every(5, X, Y, log="stdout")


def _tiny_net(n_out, n_draws, min_active, power=1.0):
    from slide.engine import Network
    return Network((4, 3, n_out), (False, True), (0, min_active), shared_negatives=n_draws,
                   negative_power=power)


def _expected_engine_normaliser(net, z, q, labels, lsh, n_draws, target):
    """E over every ordered sequence of ``n_draws`` draws with probabilities ``q`` and over
    every equally likely random fill of the engine's normaliser estimate, with the active set
    laid out as select_active does (C = labels + lsh; S \\ C; fill from outside C and S up to
    ``target``) and offsets from the engine's own rule. Also returns the old rule's mean."""
    import itertools
    n = len(z)
    c = np.concatenate([labels, lsh]).astype(np.int32)
    log_inc = np.log(-np.expm1(n_draws * np.log1p(-q)))
    e_new = e_old = 0.0
    for seq in itertools.product(range(n), repeat=n_draws):
        p = np.prod(q[list(seq)])
        sh = np.setdiff1d(np.unique(seq), c).astype(np.int32)
        rest = np.setdiff1d(np.arange(n), np.concatenate([c, sh]))
        f = max(0, min(target, n) - len(c) - len(sh))
        fills = list(itertools.combinations(rest.tolist(), f))
        for fill in fills:
            ids = np.concatenate([c, sh, np.array(fill, np.int32)]).astype(np.int32)
            src = np.array([0] * len(labels) + [1] * len(lsh) + [2] * len(sh) + [3] * f,
                           np.int8)
            off = dg.engine_log_offsets(net, ids, src, log_inc)
            e_new += p / len(fills) * dg.normaliser_engine(z, ids, off)
            # the old rule on the same set: HT / 2 on the shared ids, U'/(2f) on the fill
            old = np.zeros(len(ids))
            if net.negatives.power > 0:
                old[src == 2] = -log_inc[sh] + (np.log(0.5) if f else 0.0)
                if f:
                    old[src == 3] = np.log((n - len(c) - len(sh)) / f) + np.log(0.5)
            e_old += p / len(fills) * dg.normaliser_engine(z, ids, old)
    return e_new, e_old


@pytest.mark.parametrize("case", ["lsh+freq", "fill+freq, always", "fill+freq, sometimes",
                                  "lsh+fill+freq, always", "labels+freq"])
def test_engine_correction_is_exactly_unbiased(case):
    """The engine's normaliser (its own correction rule) averaged over EVERY draw of the shared
    negatives and every random fill equals sum_j exp(z_j) on a tiny layer (8 neurons, 3
    frequency draws), for LSH + frequency negatives and for padding + frequency negatives
    (the fill present for every draw: mixed 1/2-1/2; only for some: left out)."""
    rng = np.random.default_rng(4)
    n, n_draws = 8, 3
    z = rng.normal(size=n) * 2
    q = rng.dirichlet(np.ones(n))
    labels = np.array([3])
    lsh = {"lsh+freq": [5, 6], "fill+freq, always": [], "fill+freq, sometimes": [],
           "lsh+fill+freq, always": [6], "labels+freq": []}[case]
    target = {"lsh+freq": 0, "fill+freq, always": 5, "fill+freq, sometimes": 3,
              "lsh+fill+freq, always": 6, "labels+freq": 0}[case]
    net = _tiny_net(n, n_draws, target)
    e_new, e_old = _expected_engine_normaliser(net, z, q, labels, np.array(lsh, np.int64),
                                               n_draws, target)
    exact = np.exp(z).sum()
    # float32 weights, as the kernel stores them
    assert e_new == pytest.approx(exact, rel=2e-6)
    if target > 0:
        # the padding rule it replaces (each half weight 1/2) was biased on the same sets by
        # far more than the tolerance (the old LSH double count: the test above)
        assert abs(e_old / exact - 1) > 1e-3


def test_uniform_correction_is_unbiased_when_a_random_negative_is_present():
    """Uniform negatives: S \\ C and the fill are a uniform subset R of the neurons outside C,
    weighted U / |R|: unbiased given R non-empty; the only bias is P(R empty) times the mass
    outside C (here: every draw inside C and no fill)."""
    import itertools
    rng = np.random.default_rng(5)
    n, n_draws = 7, 3
    z = rng.normal(size=n)
    q = np.full(n, 1.0 / n)
    c = np.array([0, 2, 3], np.int32)            # 1 label + 2 LSH ids
    out_c = np.setdiff1d(np.arange(n), c)
    for target in (0, 5):
        net = _tiny_net(n, n_draws, target, power=0.0)
        log_inc = np.log(-np.expm1(n_draws * np.log1p(-q)))
        e, p_empty = 0.0, 0.0
        for seq in itertools.product(range(n), repeat=n_draws):
            p = np.prod(q[list(seq)])
            sh = np.setdiff1d(np.unique(seq), c).astype(np.int32)
            rest = np.setdiff1d(out_c, sh)
            f = max(0, target - len(c) - len(sh))
            fills = list(itertools.combinations(rest.tolist(), f))
            p_empty += p * (len(sh) + f == 0)
            for fill in fills:
                ids = np.concatenate([c, sh, np.array(fill, np.int32)]).astype(np.int32)
                src = np.array([0, 1, 1] + [2] * len(sh) + [3] * f, np.int8)
                off = dg.engine_log_offsets(net, ids, src, log_inc)
                e += p / len(fills) * dg.normaliser_engine(z, ids, off)
        want = np.exp(z).sum() - p_empty * np.exp(z[out_c]).sum()
        assert e == pytest.approx(want, rel=1e-9)
        assert (p_empty > 0) == (target == 0)


@pytest.mark.parametrize("kw", [
    dict(),                                            # vanilla + frequency negatives
    dict(sampler="topk", min_active=80),               # fill present for every draw
    dict(sampler="random", min_active=60),             # fill present for every draw
    # fill present for some draws only (without a head: the head's certain ids make the
    # block larger, and the fill then present for every draw of this data)
    dict(sampler="random", min_active=24, exact_head=0.0),
    dict(min_active=50),                               # LSH: the fill is rarely guaranteed
    dict(sampler="random", min_active=30, negative_power=0.0),
])
def test_kernel_loss_is_the_sampled_softmax_with_the_diagnostics_offsets(kw):
    """The training kernel's loss of one sample equals the sampled softmax cross-entropy over
    the diagnostics' active set with engine_log_offsets (so the rule the unbiasedness tests
    enumerate is the rule the kernel trains with), and a fill left out of the estimate gets
    exactly zero gradient."""
    model, X, Y = _fit(**kw)
    net = model.network_
    log_inc = dg.shared_log_inclusion(net)
    Wo, _ = net.output_view()
    kinds = set()
    for r in range(0, 60, 4):
        lab = np.sort(Y.indices[Y.indptr[r]:Y.indptr[r + 1]])
        if len(lab) == 0:
            continue
        xi = X.indices[X.indptr[r]:X.indptr[r + 1]]
        xv = X.data[X.indptr[r]:X.indptr[r + 1]]
        loss, _, GB, act = model.sample_loss_and_grads(xi, xv, lab, return_active=True)
        shared = dg.shared_negatives(model, 1)
        row = sp.csr_matrix(X[r])
        row.indptr = row.indptr.astype(np.int64)
        ids, src = dg.active_set(model, net.hidden(row)[0], lab, shared, serial=1, position=0)
        np.testing.assert_array_equal(ids, act[-1])
        z = dg.full_logits(model, row)[0][ids]
        off = dg.engine_log_offsets(net, ids, src, log_inc)
        zo = z + off
        want = -zo[src == dg.SOURCE_LABEL].mean() + np.log(np.exp(zo - zo.max()).sum()) \
            + zo.max()
        assert loss == pytest.approx(want, rel=1e-4, abs=1e-4)
        fill = src == dg.SOURCE_PAD
        if fill.any():
            dropped = np.isneginf(off[fill]).all()
            kinds.add("dropped" if dropped else "weighted")
            gb_fill = GB[len(GB) - Wo.shape[0] + ids[fill]]
            if dropped:
                assert (gb_fill == 0).all()
            else:
                assert (gb_fill != 0).all()
    if kw.get("min_active", 0) >= 60:
        assert kinds == {"weighted"}
    if kw.get("min_active") == 24:
        assert "dropped" in kinds
