"""Smoke tests of the benchmark harness (bench/): every script end to end on the tiny preset.

The slide path and the harness always run; TensorFlow and PyTorch baselines run when their
frameworks import (the ``bench`` / ``torch`` extras). matplotlib and psutil are optional here:
without them the scripts still write JSON and Markdown (no PNG)."""
import importlib.util
import json
import math

import numpy as np
import pytest
import scipy.sparse as sp

from bench import common, compare, dense_loop, scaling

HAS_TF = importlib.util.find_spec("tensorflow") is not None
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_MPL = importlib.util.find_spec("matplotlib") is not None
HAS_OMIKUJI = importlib.util.find_spec("omikuji") is not None
HAS_NAPKINXC = importlib.util.find_spec("napkinxc") is not None
EVAL_PAUSE = 0.6   # seconds every evaluation sleeps in the end-to-end test


# ---------------------------------------------------------------------------- harness logic

def test_time_to_target_interpolates_between_evaluations():
    curve = [{"train_seconds": 1.0, "P@1": 0.1}, {"train_seconds": 3.0, "P@1": 0.3},
             {"train_seconds": 5.0, "P@1": 0.5}]
    assert common.time_to_target(curve, 0.2) == pytest.approx(2.0)
    assert common.time_to_target(curve, 0.05) == 1.0       # already reached at the first point
    assert common.time_to_target(curve, 0.5) == pytest.approx(5.0)
    assert common.time_to_target(curve, 0.6) is None


def test_results_record_the_blas_kernels_and_the_pin(monkeypatch):
    """Every result's header names the OpenBLAS kernels and whether OPENBLAS_CORETYPE pinned
    them (a figure is comparable only under the same kernels)."""
    from slide.environment import blas_libraries
    kernels = {b["kernel"] for b in blas_libraries() if b["library"] == "openblas"}
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    text = common.blas_kernels()
    assert text.endswith("; OPENBLAS_CORETYPE = Haswell")
    assert all(k in text for k in kernels)
    monkeypatch.delenv("OPENBLAS_CORETYPE")
    assert common.blas_kernels().endswith("; OPENBLAS_CORETYPE unset")
    assert common.machine_description()["blas"] == common.blas_kernels()


def test_compare_seeds_summary_gives_means_spreads_and_each_seeds_own_ratio(tmp_path):
    """``bench/compare_seeds.py``: per system the mean and sample standard deviation over the
    seeds' runs, and each baseline's time over slide's seed by seed (not a ratio of means)."""
    from bench import compare_seeds

    def result(seconds, steady, p1):
        return {"label": "x", "train_seconds": seconds, "steady_epoch_seconds": steady,
                "samples_per_second": 100.0 / seconds,
                "final_test": {"P@1": p1, "P@5": p1 / 2, "PSP@5": p1 / 4}}

    runs = {0: ((2.0, 1.0, 0.5), (8.0, 4.0, 0.4)), 1: ((4.0, 2.0, 0.7), (10.0, 6.0, 0.2))}
    for seed, (sl, tf) in runs.items():
        folder = tmp_path / f"seed{seed}"
        folder.mkdir()
        (folder / "results.json").write_text(json.dumps({
            "data": {"data": "d"}, "machine": {"cpu": "c", "cores": 2}, "settings": {},
            "slide_params": {}, "results": {"slide": result(*sl), "tf_sampled": result(*tf)}}))
    compare_seeds.summarise(str(tmp_path), [0, 1], "cmd")
    text = (tmp_path / "summary.md").read_text()
    # slide: times 2 and 4 -> 3.00 +- 1.41; P@1 0.5 and 0.7 -> 0.6000 +- 0.1414
    assert "| 3.00 ± 1.41 | 1.50 ± 0.71 |" in text and "0.6000 ± 0.1414" in text
    # ratios 8/2 = 4.00 and 10/4 = 2.50 (steady 4/1, 6/2): mean 3.25x, not 18/6 = 3.00x
    assert "| tf_sampled | 4.00x; 4.00x | 2.50x; 3.00x | **3.25x**; 3.50x |" in text


def test_eval_schedule_every_batches_and_epoch_ends():
    s = common.EvalSchedule(batches_per_epoch=10, every_batches=4)
    due = [b for b in range(1, 31) if s.due(b, 0.0, last=False)]
    assert due == [4, 8, 10, 12, 16, 20, 24, 28, 30]
    s = common.EvalSchedule(batches_per_epoch=10, per_epoch=2)
    assert [b for b in range(1, 11) if s.due(b, 0.0, False)] == [5, 10]
    s = common.EvalSchedule(batches_per_epoch=100, every_seconds=2.0)
    assert not s.due(1, 1.5, False) and s.due(2, 2.1, False)
    s.last_eval_seconds = 2.1
    assert not s.due(3, 3.0, False) and s.due(4, 4.2, False) and s.due(5, 0.0, last=True)


def test_a_wave_of_batches_is_spread_over_its_time_and_evaluated_once_when_due():
    # slide with batches in flight reports once a wave (info["batches"]): waves of 4, 4, 2 in
    # an epoch of 10, evaluation due at batch 5 (inside the second wave) and at the epoch's end
    evaluated = []
    rec = common.Recorder(common.EvalSchedule(batches_per_epoch=10, every_batches=5),
                          np.zeros((1, 1)), None, None, 1280, 128)
    rec.evaluate = lambda n, t, epoch: evaluated.append(n)
    assert rec.after_batches(4, 4.0, 1.0, 0) is False
    assert evaluated == []                        # batches 1-4: nothing due
    rec.after_batches(4, 6.0, 0.5, 0)             # batches 5-8: batch 5 was due
    assert evaluated == [8]
    rec.after_batches(2, 7.0, 0.25, 0, last=True)
    assert evaluated == [8, 10]
    np.testing.assert_allclose(rec.batch_end, [1, 2, 3, 4, 4.5, 5, 5.5, 6, 6.5, 7])
    assert rec.losses == [1.0] * 4 + [0.5] * 4 + [0.25] * 2
    # max_batches stops at the wave that reaches it
    rec = common.Recorder(common.EvalSchedule(batches_per_epoch=10), None, None, None, 1280,
                          128, max_batches=6)
    assert rec.after_batches(4, 1.0, 1.0, 0) is False and rec.after_batches(4, 2.0, 1.0, 0)


def test_label_targets_are_one_over_label_count():
    Y = sp.csr_matrix(np.array([[1, 0, 1, 1], [0, 1, 0, 0]], dtype=np.float32))
    rows, labels, w = common.label_targets(Y)
    assert rows.tolist() == [0, 0, 0, 1] and labels.tolist() == [0, 2, 3, 1]
    np.testing.assert_allclose(w, [1 / 3, 1 / 3, 1 / 3, 1.0])


def test_samples_done_counts_short_last_batch():
    assert common.samples_done(3, n_train=250, batch_size=100) == 250
    assert common.samples_done(4, n_train=250, batch_size=100) == 350


def test_init_scales_match_their_definitions():
    W0, b0, W1, b1 = common.init_dense_weights(4000, 128, 3000, "glorot_normal", 0)
    assert W0.shape == (4000, 128) and W1.shape == (128, 3000) and not b0.any() and not b1.any()
    assert W0.std() == pytest.approx(math.sqrt(2 / 4128), rel=0.02)
    assert W1.std() == pytest.approx(math.sqrt(2 / 3128), rel=0.02)
    W0b = common.init_dense_weights(4000, 128, 3000, "glorot_normal", 0)[0]
    np.testing.assert_array_equal(W0, W0b)   # TF and PyTorch start from the same arrays
    with pytest.raises(ValueError, match="unknown init"):
        common.init_dense_weights(10, 4, 5, "bogus", 0)


def test_peak_rss_is_at_least_current_rss():
    cur = common.current_rss_bytes()
    assert cur and common.peak_rss_bytes() >= cur * 0.9


# ------------------------------------------------------------------------------ end to end

def _tiny_args(tmp_path, systems, extra=()):
    return ["--data", "tiny", "--epochs", "1", "--threads", "1", "--batch-size", "32",
            "--max-batches", "6", "--eval-every-batches", "3", "--n-eval", "100",
            "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"),
            "--systems", ",".join(systems), "--no-warmup", *extra]


def test_prefault_touches_memory_and_keys_the_cache(tmp_path):
    import resource
    assert common.prefault(0) == 0.0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    assert common.prefault(0.05) > 0.0
    # the pages were touched (at least one fault per 2 MiB huge page of 50 MiB)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults >= 25
    # and the peak memory forgot them: what the process holds now, not 50 MiB more
    assert common.peak_rss_bytes() < common.current_rss_bytes() + 0.03 * 2**30
    meta = {"key": "k"}
    keys = {}
    for gib in (None, 0.0, 0.5):
        a = compare.parse_args(_tiny_args(tmp_path, ["tf"]) + (
            ["--prefault-gib", str(gib)] if gib is not None else []))
        spec = compare.base_spec(a, meta, "tf")
        assert spec["prefault_gib"] == (gib or 0.0)
        keys[gib] = compare.cache_path(a, spec)
    # no prefault keeps the keys of results cached before the option; one is another run
    assert keys[None] == keys[0.0] != keys[0.5]


def test_engine_settings_from_the_environment_key_the_cache(tmp_path, monkeypatch):
    a = compare.parse_args(_tiny_args(tmp_path, ["slide"]))
    spec = compare.base_spec(a, {"key": "k"}, "slide")
    for k in compare.MEASUREMENT_ENV:
        monkeypatch.delenv(k, raising=False)
    plain = compare.cache_path(a, spec)
    monkeypatch.setenv("SLIDE_VECTOR_WIDTH", "256")
    assert compare.measurement_env() == {"SLIDE_VECTOR_WIDTH": "256"}
    assert compare.cache_path(a, spec) != plain


def test_compare_end_to_end(tmp_path, capsys, monkeypatch):
    iterative = ["slide"] + (["tf", "tf_sampled"] if HAS_TF else []) + (["torch"] if HAS_TORCH
                                                                        else [])
    trees = (["omikuji", "omikuji_bonsai"] if HAS_OMIKUJI else []) + (["napkinxc"] if
                                                                      HAS_NAPKINXC else [])
    systems = iterative + trees
    # every evaluation sleeps EVAL_PAUSE seconds: a training clock that counted an evaluation
    # would show the pause between the two evaluations' training times
    monkeypatch.setenv(common.EVAL_PAUSE_ENV, str(EVAL_PAUSE))
    summary = compare.main(_tiny_args(tmp_path, systems))
    out = tmp_path / "out"
    res = json.loads((out / "results.json").read_text())
    assert set(res["results"]) == set(systems)
    for s, r in res["results"].items():
        assert r["train_seconds"] > 0 and r["peak_rss_bytes"] > 50 * 2**20
        assert r["threads"] == 1
        for k in (1, 3, 5):
            assert 0.0 <= r["final_test"][f"P@{k}"] <= 1.0
            assert r["final_test"][f"PSP@{k}"] > 0.0     # same propensities for every system
        assert r["final_test"]["propensity_A"] == common.PROPENSITY_A
        if s in trees:
            assert r["one_shot"] and r["n_batches"] == 1 and r["samples"] == 600
            assert [c["batch"] for c in r["curve"]] == [1], s
            assert r["eval_seconds_total"] >= EVAL_PAUSE
            assert r["train_seconds"] == r["epoch_seconds"][0] == pytest.approx(
                r["curve"][0]["train_seconds"], abs=1e-3)
            continue
        assert r["n_batches"] == 6, s                      # --max-batches honoured
        assert r["samples"] == 6 * 32
        c = r["curve"]
        assert [p["batch"] for p in c] == [3, 6], s
        # evaluation is excluded: both pauses happened, and neither is on the training clock
        # (batches 4-6 of the tiny set take milliseconds)
        assert r["eval_seconds_total"] >= 2 * EVAL_PAUSE, s
        assert c[1]["train_seconds"] - c[0]["train_seconds"] < EVAL_PAUSE, s
        assert r["train_seconds"] == pytest.approx(c[1]["train_seconds"], abs=1e-3), s
    if HAS_TF:
        assert res["results"]["tf_sampled"]["num_sampled"] >= 1
        # the target defaults to dense TF's P@1 at its last evaluation (< one epoch here)
        assert res["target_source"].startswith("TensorFlow-CPU, full softmax")
        assert res["target_p1"] == res["results"]["tf"]["curve"][-1]["P@1"]
    if HAS_TF and HAS_TORCH:
        # same initial arrays, same loss and Adam: the two dense baselines train alike
        tf_c, th_c = res["results"]["tf"]["curve"], res["results"]["torch"]["curve"]
        for a, b in zip(tf_c, th_c):
            assert abs(a["P@1"] - b["P@1"]) <= 0.03
    md = (out / "results.md").read_text()
    assert "| slide (sampled softmax) |" in md and "peak RSS" in md
    assert (out / "time_to_accuracy.png").exists() == HAS_MPL
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].startswith("| ")                   # the table is printed last
    assert summary["commit"]

    if HAS_TF:
        # --reuse: the cached TF result comes back without a new run, labelled as reused
        compare.main(_tiny_args(tmp_path, ["tf"], ["--reuse"]))
        again = json.loads((out / "results.json").read_text())["results"]["tf"]
        assert again["_source"].startswith("reused")
        assert again["curve"] == res["results"]["tf"]["curve"]


def test_scaling_end_to_end(tmp_path, capsys):
    # every point trains one whole epoch (96 points = 3 batches of 32), the LSH variant too:
    # its first table build is inside the epoch's seconds
    systems = ["slide", "slide_lsh"] + (["tf"] if HAS_TF else ["torch"] if HAS_TORCH else [])
    args = ["--preset", "tiny", "--labels", "100,200", "--thread-labels", "200",
            "--threads-list", "1", "--epoch-points", "96", "--batch-size", "32",
            "--cache-dir", str(tmp_path / "cache")]
    summary = scaling.main(args + ["--systems", ",".join(systems), "--out", str(tmp_path / "s")])
    rows = summary["rows"]
    assert {(r["system"], r["n_labels"]) for r in rows} == {(s, n) for s in systems
                                                             for n in (100, 200)}
    for r in rows:
        assert r["batches"] == 3
        assert r["epoch_seconds"] > 0
        assert r["seconds_per_batch"] == pytest.approx(r["epoch_seconds"] / 3)
        assert 0 < r["first_batch_seconds"] <= r["epoch_seconds"]
        assert (r["rehashes"] is None) == (r["system"] not in ("slide", "slide_lsh"))
    data = json.loads((tmp_path / "s" / "scaling.json").read_text())
    assert set(data["loglog_slope_vs_labels"]) == set(systems)
    assert (tmp_path / "s" / "scaling.png").exists() == HAS_MPL
    md = (tmp_path / "s" / "scaling.md").read_text()
    assert "measured whole" in md and "extrapolated" not in md
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("| ")
    if len(systems) > 2:
        # --reuse: the baseline's points come from the cache, not a new subprocess
        again = scaling.main(args + ["--systems", systems[2], "--out", str(tmp_path / "s2"),
                                     "--reuse"])
        first = {r["n_labels"]: r for r in rows if r["system"] == systems[2]}
        for r in again["rows"]:
            assert r["source"].startswith("reused")
            assert r["epoch_seconds"] == first[r["n_labels"]]["epoch_seconds"]


def test_loglog_slope():
    assert scaling.loglog_slope([1e4, 1e5, 1e6], [2.0, 20.0, 200.0]) == pytest.approx(1.0)
    assert scaling.loglog_slope([1e4, 1e6], [3.0, 3.0]) == pytest.approx(0.0)


def test_log_prior_bias_init_matches_the_engine():
    counts = np.array([0, 3, 40, 1])
    *_, b1 = common.init_dense_weights(6, 2, 4, "glorot_normal+log_prior", 0, counts, 50)
    np.testing.assert_allclose(b1, np.log((counts + 1.0) / (50 + 4)), rtol=1e-6)
    *_, b_zero = common.init_dense_weights(6, 2, 4, "glorot_normal", 0, counts, 50)
    assert not b_zero.any()
    with pytest.raises(ValueError, match="bias"):
        common.init_dense_weights(6, 2, 4, "glorot_normal+mean", 0, counts, 50)


@pytest.mark.skipif(not HAS_TF, reason="TensorFlow (the bench extra) is not installed")
def test_tf_unigram_candidates_follow_label_counts():
    from bench.baselines import tf_dense
    tf = tf_dense._import_tf(1)
    counts = np.zeros(50, np.int64)
    counts[7] = 10_000                      # one label holds almost all the training mass
    model = tf_dense._TFModel(tf, 5, 50, 4, 1e-3, "glorot_normal", 0,
                              sampled={"num_sampled": 1, "sampler": "unigram"},
                              label_counts=counts, n_train=100)
    drawn = [int(model._candidates(tf.constant([3], tf.int64))[0].numpy()[0])
             for _ in range(40)]
    # weights (count + 1): label 7 has probability 10001 / 10050 per draw
    assert drawn.count(7) >= 35


def test_common_imports_no_runner():
    """bench.common is shared by every runner: it must not import any of them (the worker
    dispatches), or the runners and common import each other."""
    import subprocess
    import sys
    code = ("import sys, bench.common, bench.compare, bench.scaling; "
            "bad = [m for m in sys.modules if m.startswith('bench.baselines') "
            "or m in ('bench.slide_runner', 'bench.dense_loop')]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(common.REPO), env=common.thread_env(1), check=True)
    assert out.stdout.strip() == "[]"


class _FakeDenseModel:
    """A stand-in dense model: its first step is slow (as a traced tf.function's is), and it
    records every call so the loop's order can be checked."""

    def __init__(self):
        self.calls, self.state = [], 0

    def train_batch(self, X, Y):
        self.calls.append(("train", X.shape[0]))
        if len([c for c in self.calls if c[0] == "train"]) == 1:
            import time
            time.sleep(0.5)                     # "tracing" on the first step only
        self.state += 1
        return 1.0

    def predict_topk(self, X, k=5):
        self.calls.append(("predict", X.shape[0]))
        return np.tile(np.arange(k), (X.shape[0], 1))

    def reset(self):
        self.calls.append(("reset", self.state))
        self.state = 0

    def describe(self):
        return {"framework": "fake"}


def test_dense_loop_warms_up_untimed_and_resets():
    rng = np.random.default_rng(0)
    X = sp.random(100, 30, density=0.2, format="csr", dtype=np.float32, random_state=rng)
    Y = sp.csr_matrix((np.ones(100, np.float32), rng.integers(0, 8, 100), np.arange(101)),
                      shape=(100, 8))
    spec = {"batch_size": 25, "epochs": 1, "seed": 0, "n_eval": 10, "eval_every_batches": 2,
            "final_eval": True}
    model = _FakeDenseModel()
    rec, final, extra = dense_loop.train(spec, X, Y, X, Y, X[:10], Y[:10], model)
    kinds = [c[0] for c in model.calls]
    # one warm-up step and prediction, then reset (after exactly one update), then the run
    assert kinds[:3] == ["train", "predict", "reset"] and model.calls[2] == ("reset", 1)
    assert kinds.count("train") == 1 + 4 and kinds.count("reset") == 1
    assert extra["warmup_seconds"] >= 0.5 and extra["framework"] == "fake"
    assert len(rec.batch_end) == 4 and rec.batch_end[-1] < 0.5   # the slow step is not timed
    assert [c["batch"] for c in rec.curve] == [2, 4]
    assert "PSP@1" in final and model.state == 4
    # without the warm-up the slow first step is on the clock
    model = _FakeDenseModel()
    rec, _, extra = dense_loop.train(dict(spec, warmup=False), X, Y, X, Y, X[:10], Y[:10], model)
    assert extra["warmup_seconds"] is None and rec.batch_end[0] >= 0.5


# ---------------------------------------------------------------------------- roofline

def test_roofline_batch_rows_and_the_bounds_at_the_scattered_row_rate():
    from bench import roofline
    from slide.kernels.negatives import SharedNegatives
    X = sp.csr_matrix(np.array([[0, 1, 0, 1], [1, 1, 0, 0], [0, 0, 1, 1]], np.float32))
    Y = sp.csr_matrix(np.array([[1, 0, 0, 0, 1], [0, 1, 0, 0, 0], [0, 0, 0, 1, 0]],
                               np.float32))
    neg = SharedNegatives(2, 1.0, 5, 0)
    neg.set_label_counts(np.asarray(Y.sum(axis=0)).ravel())
    for ins, outs in roofline.batch_rows(X, Y, neg, 2, n_batches=3):
        # distinct features in order of first appearance; S sorted, then labels outside S
        assert len(set(ins.tolist())) == ins.shape[0]
        assert set(ins.tolist()) <= {0, 1, 2, 3}
        assert len(set(outs.tolist())) == outs.shape[0]
        assert set(outs.tolist()) <= {0, 1, 2, 3, 4}
    rows = [(np.array([3, 0, 2], np.int64), np.array([1, 4], np.int64))]
    rate = roofline.scattered_row_rate(4, 5, 8, rows, reps=1)
    assert np.isfinite(rate) and rate > 0
    c = {"nnz": 10.0, "touched_in": 8.0, "block": 64.0, "extras": 2.0}
    same = roofline.bound(c, 128, 128, 1e11, 3e10, 3e10)
    assert same["bound_sum_rows"] == pytest.approx(same["bound_sum"])
    slow = roofline.bound(c, 128, 128, 1e11, 3e10, 1e10)
    assert slow["bound_sum_rows"] < slow["bound_sum"]
    assert slow["bound_overlap_rows"] <= slow["bound_overlap"]
    assert slow["t_bytes_rows"] == pytest.approx(3 * slow["t_bytes"])


def test_roofline_takes_a_concurrent_gemm_reading_below_one_call_again(monkeypatch):
    """Two concurrent calls read under GEMM_FLOOR x one call's rate: measured again (the best
    kept, at most GEMM_RETRIES times), so a round whose calls barely overlapped does not get a
    lower bound and a higher fraction."""
    from types import SimpleNamespace
    from bench import roofline
    readings = iter([50e9, 70e9, 120e9, 999e9])
    monkeypatch.setattr(roofline, "gemm_rate", lambda *a, **k: next(readings))
    monkeypatch.setattr(roofline, "memory_bandwidth", lambda: 3e10)
    monkeypatch.setattr(roofline, "scattered_row_rate", lambda *a, **k: 2e10)
    monkeypatch.setattr(roofline, "train_rate", lambda *a, **k: 1000.0)
    monkeypatch.setattr(roofline, "median_round_trip_ns", lambda *a, **k: 60.0)
    c = {"nnz": 10.0, "touched_in": 8.0, "block": 64.0, "extras": 2.0}
    X, Y = sp.csr_matrix((4, 30), dtype=np.float32), sp.csr_matrix((4, 50), dtype=np.float32)
    args = SimpleNamespace(threads=2, shared_negatives=64, exact_head=0.5, repeat=1)
    r = roofline.measure_round(X, Y, c, [], args, 128, 128, ("batched",), one_call=80e9)
    assert r["gemm_flops_per_s"] == 120e9 and r["gemm_retries"] == 2
    readings = iter([50e9, 40e9, 45e9, 30e9, 999e9])      # stays low: kept, after 3 tries
    r = roofline.measure_round(X, Y, c, [], args, 128, 128, ("batched",), one_call=80e9)
    assert r["gemm_flops_per_s"] == 50e9 and r["gemm_retries"] == roofline.GEMM_RETRIES
    readings = iter([100e9, 999e9])                         # no floor (one thread): no retry
    r = roofline.measure_round(X, Y, c, [], args, 128, 128, ("batched",))
    assert r["gemm_flops_per_s"] == 100e9 and r["gemm_retries"] == 0
    assert r["core_round_trip_ns"] == [60.0, 60.0] and r["placement"] == "near"


def test_crosscore_round_trip_and_the_placement_of_a_round():
    """The cores' round trip is a finite positive time where two CPUs are usable; a round's
    placement is near or far only when every reading agrees; the roofline's report splits
    its rounds by placement."""
    import os
    from bench import crosscore, roofline
    if len(os.sched_getaffinity(0)) >= 2:
        ns = crosscore.round_trip_ns(n=2000)
        assert np.isfinite(ns) and 0 < ns < 1e6
    assert np.isnan(crosscore.round_trip_ns(cpus=(0,)))
    assert np.isnan(crosscore.round_trip_ns(cpus=(0, 0)))          # one CPU: no cache transfer
    assert crosscore.placement(60.0, 80.0) == "near"
    assert crosscore.placement(350.0, 380.0) == "far"
    assert crosscore.placement(60.0, 380.0) == "mixed"
    assert crosscore.placement(float("nan")) == "unknown"
    rounds = [{"placement": p, "fraction_of_sum_bound_rows": f}
              for p, f in (("near", 0.6), ("near", 0.5), ("far", 0.4), ("mixed", 0.45))]
    text = "\n".join(roofline.placement_lines(rounds))
    assert "cores near: 2 round(s), median 0.55 (0.50-0.60), 2 at >= 50 %" in text
    assert "cores far: 1 round(s), median 0.40 (0.40-0.40), 0 at >= 50 %" in text
