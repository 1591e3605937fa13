"""Every script of bench/ starts as a script and parses its arguments (``--help``), and the
cheap ones run end to end on a tiny set. The harness itself (compare, scaling, roofline,
accuracy, ablation, fuzz, the data builders, the baselines) has deeper tests of its own
(tests/test_bench_*.py, test_accuracy_smoke.py, test_ablation_smoke.py, test_fuzz.py)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")

# library modules of the harness, not scripts: they take no command line of their own
LIBRARIES = {"__init__.py", "common.py", "dense_loop.py", "slide_runner.py", "worker.py"}


def scripts():
    return sorted(f for f in os.listdir(BENCH) if f.endswith(".py") and f not in LIBRARIES)


def test_every_bench_script_has_a_line_in_bench_readme():
    with open(os.path.join(BENCH, "README.md")) as f:
        text = f.read()
    for name in scripts() + ["baselines/"]:
        assert f"`{name}`" in text, name


def test_every_bench_script_answers_help():
    # one interpreter for all of them: each runs as ``python bench/NAME.py --help`` would
    code = (
        "import contextlib, io, json, runpy, sys\n"
        "out = {}\n"
        "for path in sys.argv[1:]:\n"
        "    sys.argv = [path, '--help']\n"
        "    buf = io.StringIO()\n"
        "    try:\n"
        "        with contextlib.redirect_stdout(buf):\n"
        "            runpy.run_path(path, run_name='__main__')\n"
        "        code = 0\n"
        "    except SystemExit as e:\n"
        "        code = e.code\n"
        "    out[path] = [code, buf.getvalue()]\n"
        "print(json.dumps(out))\n")
    paths = [os.path.join(BENCH, f) for f in scripts()]
    res = subprocess.run([sys.executable, "-c", code, *paths], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    for path in paths:
        rc, text = got[path]
        assert rc in (0, None), (path, rc, text)
        assert "usage:" in text, (path, text)


def test_make_data_writes_a_frozen_set(tmp_path):
    from bench import make_data
    from slide import read_xc
    out = tmp_path / "tiny"
    make_data.main(["tiny", str(out), "--n-train", "120", "--n-test", "40"])
    X, Y = read_xc(str(out / "train.txt"))
    Xt, Yt = read_xc(str(out / "test.txt"))
    assert X.shape[0] == 120 and Xt.shape[0] == 40
    source = json.loads((out / "source.json").read_text())
    assert source["preset"] == "tiny" and source["shapes"]["X_train"][0] == 120


def test_learnability_prints_the_baselines_rows(capsys):
    from bench import learnability
    learnability.run("tiny:n_train=300,n_test=100")
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| tiny")]
    assert [r.split("|")[2].strip() for r in rows] == ["most_frequent", "centroid", "knn"]
    for r in rows:
        p1 = float(r.split("|")[3])
        assert 0.0 <= p1 <= 1.0


def test_memory_reads_the_peak_after_the_data_the_fit_and_the_prediction(tmp_path):
    from bench import memory
    out = str(tmp_path / "mem")
    res = memory.main(["--preset", "tiny", "--n-test", "50", "--param", "neighbours=0",
                       "--param", "hidden_sizes=[16]", "--out", out])
    assert 0 < res["after_data"] <= res["after_fit"] <= res["after_predict"]
    assert res["params"]["neighbours"] == 0 and res["labels"] > 0
    with open(out + ".json") as f:
        assert json.load(f)["after_fit"] == res["after_fit"]
    with open(out + ".md") as f:
        assert "| after fit |" in f.read()


def test_distributed_measures_a_pipelined_sharded_run_and_tabulates_the_seeds():
    """bench/distributed.py's measurement in this process (the script runs each in a fresh
    one), on a small synthetic set with the shards in process: timed epochs after the first,
    samples per second, P@1; then its table of means over seeds against the single process."""
    import argparse
    from bench import distributed
    cfg = dict(labels=300, n_train=400, n_test=100, epochs=2, seed=0, backend="local")
    rows = []
    for shards, depth in ((0, 1), (2, 1), (2, 3)):
        r = distributed.run_one(dict(cfg, shards=shards, depth=depth))
        assert "error" not in r, r
        assert r["epoch_seconds"] > 0 and r["samples_per_s"] > 0 and 0 <= r["P@1"] <= 1
        if shards == 0:
            # the second epoch whole (its kernels compiled before the clock: about half the
            # training seconds), not the batches after its last callback
            assert r["epoch_seconds"] > 0.25 * r["train_seconds"]
        assert r["batches"] == 2 * 4
        assert (r["bytes_per_batch"] > 0) == (shards > 0)
        r.update(config=distributed._config_name(shards, "local", depth, 0.0), seed=0)
        rows.append(r)
    table = distributed._md("tiny", rows, argparse.Namespace(epochs=2), "abc1234")
    assert "| single process |" in table and "| 2 shards (in process), depth 3 |" in table
    assert "1.00x" in table


def test_the_latency_model_predicts_from_the_zero_latency_points():
    from bench import distributed

    def row(depth, lat, ms):
        return dict(shards=2, depth=depth, latency_ms=lat, epochs=1, batches=100,
                    epoch_seconds=ms / 10.0)
    rows = [row(1, 0.0, 10.0), row(1, 2.0, 18.5), row(2, 0.0, 8.0), row(3, 0.0, 5.0),
            row(3, 2.0, 6.0), row(3, 5.0, 9.5), row(2, 5.0, 18.0)]
    got = {(d, l): (m, p) for d, l, m, p in distributed.latency_model(rows)}
    assert got[(1, 2.0)] == pytest.approx((18.5, 18.0))         # T1(0) + 4 L
    assert got[(2, 5.0)] == pytest.approx((18.0, 18.0))         # T2(0) + 2 L
    assert got[(3, 2.0)][1] == pytest.approx(6.0)               # max(5, (8 + 4) / 2)
    assert got[(3, 5.0)][1] == pytest.approx(9.0)               # (8 + 10) / 2
    assert "| 3 | 5 | 9.50 | 9.00 | -5 % |" in distributed._model_md(rows)
