"""bench/ablation.py end to end at a tiny shape: every configuration, two seeds."""
import json

import numpy as np
import pytest

from bench import ablation


def test_ablation_writes_table_json_and_plot(tmp_path):
    out = str(tmp_path / "abl")
    results = ablation.main(["--preset", "tiny", "--scale", "1", "--size", "32", "--seeds", "2",
                             "--threads", "1", "--K", "2", "--L", "4", "--range-pow", "6",
                             "--hidden", "16", "--lr", "1e-2", "--diag-rows", "16",
                             "--out", out])
    names = list(ablation.configs(32))
    assert list(results) == names
    for name in names:
        assert len(results[name]) == 2
        for r in results[name]:
            assert 0 <= r["P@1"] <= 1 and 0 <= r["P@5"] <= 1
            assert r["seconds_per_epoch"] > 0
            assert 0 < r["mass"] <= 1 and 0 < r["recall32"] <= 1
            assert 0 <= r["PSP@5"] <= 1
            assert len(r["curve"]) == 1 and 0 <= r["curve"][0]["P1"] <= 1
    # equal MEASURED size: calibrated draw counts bring every configuration's mean training
    # active size to the target (labels included), not equal draw counts
    for name in names:
        act = np.mean([r["active_train"] for r in results[name]])
        assert abs(act - 32) <= 0.2 * 32, (name, act)
    # equal size: every configuration's active set is about labels + 32 non-label neurons
    for name in ("freq", "uniform", "lsh-only"):
        assert all(r["active"] <= 32 + 8 for r in results[name])
    cal = json.loads((tmp_path / "abl.json").read_text())["meta"]["configs"]
    # the LSH ids take part of the budget, so fewer draws are left to the frequency sampler
    assert cal["lsh+freq"]["shared_negatives"] < cal["freq"]["shared_negatives"]
    assert all(r["lsh"] == 0 for r in results["freq"] + results["uniform"])
    meta = json.loads((tmp_path / "abl.json").read_text())["meta"]
    assert meta["ref"] == "freq" and meta["seeds"] == 2
    md = (tmp_path / "abl.md").read_text()
    for name in names:
        assert f"| {name} |" in md
    assert "±" in md
    pytest.importorskip("matplotlib")
    assert (tmp_path / "abl.png").stat().st_size > 1000


def test_summary_calls_small_differences_noise():
    res = {"a": [{"P@1": 0.50, "P@5": 0.3, "seconds_per_epoch": 1.0},
                 {"P@1": 0.52, "P@5": 0.3, "seconds_per_epoch": 1.1}],
           "b": [{"P@1": 0.51, "P@5": 0.6, "seconds_per_epoch": 2.0},
                 {"P@1": 0.53, "P@5": 0.61, "seconds_per_epoch": 2.1}]}
    table = dict(ablation.summarise(res, ["a", "b"], "a"))
    assert table["b"]["P@1"][2] == "noise"
    assert table["b"]["P@5"][2].startswith("+0.3")
    assert table["a"]["P@1"][2] == ""


def test_unknown_configuration_is_rejected():
    with pytest.raises(SystemExit):
        ablation.main(["--configs", "nope"])


def test_draws_for_inverts_the_expected_distinct_count():
    rng = np.random.default_rng(0)
    q = rng.pareto(1.0, 500) + 1e-3
    q /= q.sum()
    n = ablation.draws_for(q, 120)
    assert ablation.expected_distinct(q, n - 1) < 120 <= ablation.expected_distinct(q, n)
    # the analytic count matches simulated draws
    sim = np.mean([np.unique(rng.choice(500, n, p=q)).size for _ in range(300)])
    assert abs(sim - 120) < 3
