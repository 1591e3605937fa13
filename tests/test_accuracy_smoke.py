"""Smoke test of bench/accuracy.py at the tiny preset: levers expand to runs, every run records
a per-epoch curve and final metrics, the label trees run beside slide, and the report files are
written from the accumulated records."""
import importlib.util
import json

import numpy as np
import pytest
import scipy.sparse as sp

from bench import accuracy

HAS_OMIKUJI = importlib.util.find_spec("omikuji") is not None
HAS_NAPKINXC = importlib.util.find_spec("napkinxc") is not None


def test_levers_expand_to_one_run_per_value_on_the_base():
    args = accuracy.parse_args(["--preset", "tiny", "--name", "t", "--base", '{"epochs": 2}',
                                "--lever", "learning_rate=1e-3,1e-2",
                                "--run", '{"lr_schedule": "cosine", "warmup_batches": 3}',
                                "--defaults"])
    runs = accuracy.expand_runs(args)
    assert [n for n, _ in runs] == ["base", "learning_rate=0.001", "learning_rate=0.01",
                                    'lr_schedule="cosine" warmup_batches=3',
                                    "SlideClassifier()"]
    assert runs[2][1] == {"epochs": 2, "learning_rate": 1e-2}
    assert runs[3][1] == {"epochs": 2, "lr_schedule": "cosine", "warmup_batches": 3}
    assert runs[4][1] == {}


def test_l2_normalise_gives_unit_rows_and_keeps_empty_rows():
    X = sp.csr_matrix(np.array([[3.0, 4.0, 0.0], [0.0, 0.0, 0.0], [0.0, 2.0, 0.0]],
                               np.float32))
    N = accuracy.l2_normalise(X)
    np.testing.assert_allclose(N.toarray(), [[0.6, 0.8, 0.0], [0, 0, 0], [0, 1.0, 0]],
                               rtol=1e-6)
    np.testing.assert_allclose(X.toarray()[0], [3.0, 4.0, 0.0])     # input untouched


def test_summary_takes_mean_and_std_over_seeds():
    recs = [{"dataset": "d", "system": "slide", "run": "r", "train_seconds": s,
             "curve": [{"epoch": 1.0}], "final": {"P@1": p, "P@5": p, "PSP@5": p}}
            for s, p in ((1.0, 0.5), (3.0, 0.7))]
    (row,) = accuracy.summarise(recs)
    assert row["seconds"] == pytest.approx(2.0)
    assert row["P@1"][0] == pytest.approx(0.6)
    assert row["P@1"][1] == pytest.approx(np.std([0.5, 0.7], ddof=1))
    # the same change on another base is another run
    other = dict(recs[0], params={"learning_rate": 1e-3})
    rows = accuracy.summarise(recs + [other])
    assert [r["seeds"] for r in rows] == [2, 1]
    assert rows[1]["config"] == "learning_rate=0.001"


@pytest.mark.skipif(not (HAS_OMIKUJI and HAS_NAPKINXC), reason="omikuji / napkinxc missing")
def test_end_to_end_on_tiny_with_label_trees(tmp_path):
    out = str(tmp_path / "acc")
    records = accuracy.main([
        "--preset", "tiny", "--name", "tiny", "--trees", "omikuji,napkinxc", "--tree-runs", "2",
        "--base", '{"hidden_sizes": [16], "learning_rate": 1e-2, "epochs": 2}',
        "--lever", 'normalize="l2"', "--seeds", "0,1", "--threads", "1",
        "--eval-points", "40", "--evals-per-epoch", "2", "--out", out,
        "--work-dir", str(tmp_path)])
    systems = [r["system"] for r in records]
    assert systems == ["omikuji"] * 2 + ["napkinxc"] * 2 + ["slide"] * 4
    for r in records:
        assert set(r["final"]) == {"P@1", "P@5", "PSP@5"}
        assert all(0.0 <= v <= 1.0 for v in r["final"].values())
        assert r["train_seconds"] > 0
    slide_runs = [r for r in records if r["system"] == "slide"]
    for r in slide_runs:
        # 2 epochs x 2 evaluations, at increasing epochs and cumulative seconds
        assert [p["epoch"] for p in r["curve"]] == pytest.approx([0.5, 1.0, 1.5, 2.0], abs=0.15)
        secs = [p["seconds"] for p in r["curve"]]
        assert secs == sorted(secs)
        assert r["compile_seconds"] >= 0
    assert {r["normalize"] for r in slide_runs} == {None, "l2"}
    # the seeds differ, so the runs do
    base = [r for r in slide_runs if r["run"] == "base"]
    assert [r["seed"] for r in base] == [0, 1]
    # the label trees learn the tiny set far above chance (1 / n_labels)
    trees = [r for r in records if r["system"] != "slide"]
    assert all(r["final"]["P@1"] > 0.2 for r in trees)
    lines = (tmp_path / "acc.jsonl").read_text().splitlines()
    assert [json.loads(l)["system"] for l in lines] == systems
    md = (tmp_path / "acc.md").read_text()
    assert "| slide | base | hidden_sizes=[16] learning_rate=0.01 epochs=2 | 2 |" in md
    assert ('| slide | normalize="l2" | hidden_sizes=[16] learning_rate=0.01 epochs=2 '
            'normalize="l2" | 2 |') in md
    # each tree's two fits are one row, their mean and std
    assert "| omikuji | omikuji (defaults) | library defaults | 2 |" in md
    assert "| napkinxc | napkinXC PLT (defaults) | library defaults | 2 |" in md
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "acc.png").stat().st_size > 0
    # a second invocation appends: the report covers both
    accuracy.main(["--preset", "tiny", "--name", "tiny2", "--base", '{"hidden_sizes": [16]}',
                   "--threads", "1", "--eval-points", "20", "--out", out])
    assert "## tiny2" in (tmp_path / "acc.md").read_text()
    assert "## tiny\n" in (tmp_path / "acc.md").read_text()


def test_ensemble_and_budget_runs_on_tiny(tmp_path):
    out = str(tmp_path / "acc")
    records = accuracy.main([
        "--preset", "tiny", "--name", "tiny", "--no-base",
        "--base", '{"hidden_sizes": [16], "learning_rate": 1e-2, "epochs": 2}',
        "--run", '{"n_models": 2}', "--run", '{"time_budget": 1e-6}',
        "--run", '{"search": {"learning_rate": [1e-3, 1e-2]}}', "--threads", "1",
        "--eval-points", "40", "--out", out, "--work-dir", str(tmp_path)])
    ens, budget, search = records
    assert ens["run"] == "n_models=2" and ens["params"]["n_models"] == 2
    assert len(ens["curve"]) == 1 and ens["curve"][0]["epoch"] == pytest.approx(2.0)
    from slide.synthetic import PRESETS
    n_batches = -(-PRESETS["tiny"]["n_train"] // 128)       # batch_size's default
    assert ens["batches"] == 2 * 2 * n_batches              # 2 members x 2 epochs
    assert not ens["stopped_early"] and 0.0 <= ens["final"]["P@1"] <= 1.0
    # the budget is spent after the first batch: the run says it stopped early
    assert budget["stopped_early"] and budget["batches"] == 1
    md = (tmp_path / "acc.md").read_text()
    assert ("| slide | n_models=2 | hidden_sizes=[16] learning_rate=0.01 epochs=2 n_models=2 "
            "fused=false |") in md
    # the search's record: every trial's held-out P@5, batches and rank; the winner ranks first
    assert [t["params"]["learning_rate"] for t in search["trials"]] == [1e-3, 1e-2]
    best = min(search["trials"], key=lambda t: t["rank"])
    assert search["best_params"] == best["params"] and 0.0 <= search["final"]["P@1"] <= 1.0
    assert max(t["batches"] for t in search["trials"]) == best["batches"] > 0
