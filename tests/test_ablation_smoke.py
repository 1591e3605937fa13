"""bench/ablation.py end to end at a tiny shape: every configuration, two seeds."""
import json

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
    # equal size: every configuration's active set is about labels + 32 non-label neurons
    for name in ("freq", "uniform", "lsh-only"):
        assert all(r["active"] <= 32 + 8 for r in results[name])
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
