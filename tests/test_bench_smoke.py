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

from bench import common, compare, scaling

HAS_TF = importlib.util.find_spec("tensorflow") is not None
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_MPL = importlib.util.find_spec("matplotlib") is not None


# ---------------------------------------------------------------------------- harness logic

def test_time_to_target_interpolates_between_evaluations():
    curve = [{"train_seconds": 1.0, "P@1": 0.1}, {"train_seconds": 3.0, "P@1": 0.3},
             {"train_seconds": 5.0, "P@1": 0.5}]
    assert common.time_to_target(curve, 0.2) == pytest.approx(2.0)
    assert common.time_to_target(curve, 0.05) == 1.0       # already reached at the first point
    assert common.time_to_target(curve, 0.5) == pytest.approx(5.0)
    assert common.time_to_target(curve, 0.6) is None


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


def test_compare_end_to_end(tmp_path, capsys):
    systems = ["slide"] + (["tf", "tf_sampled"] if HAS_TF else []) + (["torch"] if HAS_TORCH
                                                                      else [])
    summary = compare.main(_tiny_args(tmp_path, systems))
    out = tmp_path / "out"
    res = json.loads((out / "results.json").read_text())
    assert set(res["results"]) == set(systems)
    for s, r in res["results"].items():
        assert r["n_batches"] == 6, s                      # --max-batches honoured
        assert r["samples"] == 6 * 32
        assert [c["batch"] for c in r["curve"]] == [3, 6], s
        assert r["train_seconds"] > 0 and r["peak_rss_bytes"] > 50 * 2**20
        assert 0.0 <= r["final_test"]["P@1"] <= 1.0
        assert r["threads"] == 1
        # evaluation is excluded: the training clock never includes an evaluation's duration
        assert r["train_seconds"] < r["process_seconds"]
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
    assert "| slide (LSH-sampled softmax) |" in md and "peak RSS" in md
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
    systems = ["slide"] + (["tf"] if HAS_TF else ["torch"] if HAS_TORCH else [])
    summary = scaling.main(["--preset", "tiny", "--labels", "100,200", "--thread-labels", "200",
                            "--threads-list", "1", "--systems", ",".join(systems),
                            "--warmup", "1", "--slide-batches", "3", "--baseline-batches", "2",
                            "--batch-size", "32", "--out", str(tmp_path / "s"),
                            "--cache-dir", str(tmp_path / "cache")])
    rows = summary["rows"]
    assert {(r["system"], r["n_labels"]) for r in rows} == {(s, n) for s in systems
                                                             for n in (100, 200)}
    for r in rows:
        timed = 3 if r["system"] == "slide" else 2
        assert r["timed_batches"] == timed
        assert r["seconds_per_batch"] > 0
        assert r["extrapolated_epoch_seconds"] == pytest.approx(
            r["seconds_per_batch"] * math.ceil(100_000 / 32))
    data = json.loads((tmp_path / "s" / "scaling.json").read_text())
    assert set(data["loglog_slope_vs_labels"]) == set(systems)
    assert (tmp_path / "s" / "scaling.png").exists() == HAS_MPL
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("| ")
    if len(systems) > 1:
        # --reuse: the baseline's points come from the cache, not a new subprocess
        again = scaling.main(["--preset", "tiny", "--labels", "100,200", "--thread-labels", "200",
                              "--threads-list", "1", "--systems", systems[1], "--warmup", "1",
                              "--slide-batches", "3", "--baseline-batches", "2",
                              "--batch-size", "32", "--out", str(tmp_path / "s2"),
                              "--cache-dir", str(tmp_path / "cache"), "--reuse"])
        first = {r["n_labels"]: r for r in rows if r["system"] == systems[1]}
        for r in again["rows"]:
            assert r["source"].startswith("reused")
            assert r["seconds_per_batch"] == first[r["n_labels"]]["seconds_per_batch"]


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
