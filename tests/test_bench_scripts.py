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
            # training seconds; the first also starts the workers' threads, which on a loaded
            # machine took 4x a 10-ms epoch), not the batches after its last callback (~0)
            assert r["epoch_seconds"] > 0.1 * r["train_seconds"]
        assert r["batches"] == 2 * 4
        assert (r["bytes_per_batch"] > 0) == (shards > 0)
        r.update(config=distributed._config_name(shards, "local", depth, 0.0), seed=0)
        rows.append(r)
    table = distributed._md("tiny", rows, argparse.Namespace(epochs=2), "abc1234")
    assert "| single process |" in table and "| 2 shards (in process), depth 3 |" in table
    assert "1.00x" in table


def test_the_cost_model_adds_the_parts_of_a_batch():
    """bench/distributed.py's ``predict_ms``: the synchronous loop adds the driver, the
    shards (sharing the cores), the messages and four latencies; a pipeline shares one round
    trip among K batches, bounded by the busiest part."""
    from bench import distributed as d
    msgs = {0: 1.5, 1: 0.8, 2: 0.7, 4: 0.4}
    assert d.predict_ms(1.0, [3.0, 2.0], msgs, 1, 2.0, cores=2) == pytest.approx(1 + 3 + 1.5 + 8)
    # four shards on two cores take two turns; on machines of their own, one
    assert d.predict_ms(1.0, [1.0] * 4, msgs, 1, 0.0, cores=2) == pytest.approx(1 + 2 + 1.5)
    assert d.predict_ms(1.0, [1.0] * 4, msgs, 1, 0.0) == pytest.approx(1 + 1 + 1.5)
    # depth 2: a round trip a batch; depth 3: one shared by two batches...
    assert d.predict_ms(1.0, [3.0], msgs, 2, 0.5, cores=2) == pytest.approx(1 + 3 + 0.8 + 1)
    assert d.predict_ms(1.0, [3.0], msgs, 3, 5.0, cores=2) == pytest.approx((1 + 3 + 0.8 + 10) / 2)
    # ...unless a part is busier: the shard's compute, all the work over the cores (compute
    # and messages), the messages alone
    assert d.predict_ms(1.0, [3.0], msgs, 3, 0.0, cores=2) == pytest.approx(3.0)
    assert d.predict_ms(1.0, [1.2] * 4, msgs, 3, 0.0, cores=2) == pytest.approx(3.65)
    assert d.predict_ms(0.1, [0.1], msgs, 5, 0.0) == pytest.approx(0.4)
    assert d.predict_ms(0.1, [0.1], msgs, 4, 0.0) == pytest.approx(0.7)   # k = 2 measured

    def row(depth, lat, ms):
        return dict(config=f"d{depth} L{lat}", shards=2, depth=depth, latency_ms=lat, epochs=1,
                    batches=100, epoch_seconds=ms / 10.0)
    rows = [row(1, 0.0, 6.0), row(1, 0.0, 7.0), row(3, 2.0, 4.0), dict(row(1, 0, 1), shards=0)]
    costs = {2: {"driver_ms": 1.0, "shard_ms": [3.0, 2.0]}}
    got = d.model_points(rows, costs, {2: msgs}, 2)
    assert got == [("d1 L0.0", 6.5, pytest.approx(5.5)), ("d3 L2.0", 4.0, pytest.approx(4.4))]
    table = d._model_md(rows, costs, {2: msgs}, 2, fitted=False)
    assert "| d1 L0.0 | 6.50 | 5.50 | -15 % |" in table and "| 2 | 1.00 | 3.00, 2.00 |" in table
    # the effective cores that reproduce a machine's points are found again
    costs = {1: {"driver_ms": 2.0, "shard_ms": [3.0]}, 4: {"driver_ms": 2.0, "shard_ms": [1.0] * 4}}
    msgs = {S: msgs for S in costs}
    rows = [dict(row(depth, 0.0, d.predict_ms(2.0, costs[S]["shard_ms"], msgs[S], depth, 0.0,
                                              cores=1.35)), shards=S, config=f"{S} {depth}")
            for S in costs for depth in (1, 2, 3)]
    assert d.fit_effective_cores(rows, costs, msgs, 2) == pytest.approx(1.35)


def test_the_cost_models_compute_is_timed_per_shard():
    """``compute_costs``: the driver's and each shard's ms a batch, from a sharded fit in
    process (a small synthetic set)."""
    from bench import distributed
    got = distributed.compute_costs(dict(labels=300, n_train=400, n_test=100, epochs=2, seed=0,
                                         shards=2))
    assert got["batches"] == 4 and len(got["shard_ms"]) == 2
    assert got["driver_ms"] > 0 and min(got["shard_ms"]) > 0


def test_the_cost_models_inputs_are_averaged_over_seeds():
    from bench import distributed
    inputs = [(2, {"driver_ms": 1.0, "shard_ms": [2.0, 4.0]}, {"0": 1.0, "1": 0.5}),
              (2, {"driver_ms": 3.0, "shard_ms": [4.0, 6.0]}, {"0": 2.0, "1": 1.5}),
              (1, {"driver_ms": 5.0, "shard_ms": [7.0]}, {"0": 0.5, "1": 0.25})]
    costs, messages = distributed._mean_inputs(inputs)
    assert costs[2] == {"driver_ms": 2.0, "shard_ms": [3.0, 5.0], "measurements": 2}
    assert messages == {2: {0: 1.5, 1: 1.0}, 1: {0: 0.5, 1: 0.25}}


def test_the_cluster_prediction_reads_a_runs_inputs(tmp_path):
    from bench import distributed
    path = tmp_path / "distributed_x.json"
    path.write_text(json.dumps({"commit": "abc", "runs": [], "cost_model": {
        "costs": {"2": {"driver_ms": 1.0, "shard_ms": [2.0, 1.0]}},
        "messages": {"2": {"0": 1.0, "1": 0.5, "2": 0.4, "4": 0.3}}}}))
    table = distributed.cluster_md(str(path), batch_size=100, latencies=(0.5,), depths=(1, 3))
    # synchronous: 1 + 2 + 1 + 4 x 0.5 = 6 ms; depth 3: (1 + 2 + 0.5 + 1) / 2 = 2.25 ms
    assert "| 2 | 0.5 | 16,667 | 44,444 |" in table and "commit abc" in table


def test_the_first_fit_report_alternates_checkouts_each_cold_then_warm(monkeypatch, tmp_path):
    """``compile_time.py --first-fit --before``: per round and checkout, two fresh interpreters
    on that checkout's cache directory, the first on an empty one (emptied again each round),
    each reading the file and fitting with that checkout's slide; then the warm fits; the
    summary's medians and means come from those rows."""
    from bench import compile_time
    new, old = str(tmp_path / "new"), str(tmp_path / "old")
    calls = []

    def measure(arg, cache, child, root):
        calls.append((arg, cache, sorted(os.listdir(cache)), child, root))
        os.makedirs(os.path.join(cache, f"filled{len(calls)}"))
        cold = len(os.listdir(cache)) == 1
        slow = 2.0 if root == old else 1.0
        return {"import_s": 0.5, "read_s": (4.0 if cold else 1.0) * slow,
                "fit_s": (60.0 if cold else 5.0) * slow, "compile_s": 50.0 if cold else 0.1,
                "train_s": 2.0 * slow + 0.1 * len(calls), "rows": 24242, "labels": 581,
                "process_s": (70.0 if cold else 7.0) * slow + len(calls),
                "gc_s": 3.0 if cold else 0.2, "peak_mb": 700.0 + len(calls),
                "kernels": [["slide.a.big", 1, 30.0], ["slide.b.small", 2, 10.0]]}
    monkeypatch.setattr(compile_time, "measure", measure)
    monkeypatch.setattr(compile_time, "commit", lambda tree=None: {new: "aaa", old: "bbb"}.get(
        tree, "ccc"))
    lines = compile_time.first_fit_report("/data/train.txt", [new, old], rounds=2, warm_fits=1)
    assert [c[4] for c in calls] == [new, new, old, old, new, new, old, old, new, old]
    assert all(json.loads(c[0]) == ["/data/train.txt", 0, {}]
               and c[3] is compile_time.FIRST_FIT_CHILD for c in calls)
    # each round starts on an empty cache of its own checkout; its warm run sees the cold one's
    assert [c[2] for c in calls[:2]] == [[], ["filled1"]]
    assert calls[4][2] == [] and calls[4][1] == calls[0][1] != calls[2][1]
    rows = [line for line in lines if line.startswith("| `aaa`") or line.startswith("| `bbb`")]
    assert rows[0] == "| `aaa` | cold | 0.5 | 4.0 | 60.0 | 50.0 | 2.10 | 71.0 | 3.0 | 701 |"
    assert rows[1].endswith("| 0.2 | 702 |")
    assert len(rows) == 10 + 2
    # cold whole process: aaa 71 and 75 (median 73.0); bbb 143 and 147 (145.0); warm network
    # training: aaa 2.2, 2.6, 2.9 -> 2.57; bbb 4.4, 4.8, 5.0
    assert rows[-2] == "| `aaa` | 73.0 | 4.0 | 2.57 ± 0.35 (3 fits) |"
    assert rows[-1].startswith("| `bbb` | 145.0 | 8.0 | 4.73 ± ")
    # the first checkout's first cold run: its kernels' own compile seconds, largest first
    assert lines.count("| `slide.a.big` | 1 | 30.00 | 75% |") == 2     # one table a checkout
    assert lines[-3] == "| `slide.b.small` | 2 | 10.00 | 25% |"
    # and the kernels that compiled more than once, with how many times
    assert lines[-1] == ("Kernels of this process compiled more than once (a signature each): "
                         "`slide.b.small` (2).")
    assert any("24,242 rows, 581 labels" in line for line in lines)
    # --rows: the children fit on the file's first rows, and the report says so
    calls.clear()
    lines = compile_time.first_fit_report("/data/train.txt", [new], n_rows=100)
    assert [json.loads(c[0]) for c in calls] == [["/data/train.txt", 100, {}]] * 2
    assert "--rows 100" in lines[2] and "(the first of the file)" in lines[2]
    # --params: the children fit with those hyperparameters, and the report names them
    calls.clear()
    lines = compile_time.first_fit_report("/data/train.txt", [new], params={"rerank": False})
    assert [json.loads(c[0])[2] for c in calls] == [{"rerank": False}] * 2
    assert "rerank=False, random_state=0" in lines[0]
    assert """--params '{"rerank": false}'""" in lines[2]


def test_the_first_fit_report_lists_the_kernels_compiled_more_than_once():
    from bench import compile_time
    kernels = [["slide.a", 1, 3.0], ["slide.c", 3, 2.0], ["slide.b", 2, 1.0]]
    assert compile_time.twice_lines(kernels)[-1].endswith(": `slide.b` (2), `slide.c` (3).")
    assert compile_time.twice_lines(kernels[:1])[-1].endswith(": none.")


def test_the_first_fit_report_gives_llvms_seconds_all_and_in_linked_libraries():
    """``compile_time.llvm_lines``: a cold run's LLVM seconds by part, summed, and as a share of
    its compile, for all libraries and those linked into another; nothing without figures."""
    from bench import compile_time
    cold = {"compile_s": 40.0, "llvm": {
        "all": {"function passes": 4.0, "module passes": 6.0, "machine code": 10.0},
        "linked": {"module passes": 3.0, "machine code": 2.0},
        "libraries": 9, "linked_libraries": 4}}
    lines = compile_time.llvm_lines(cold)
    assert lines[-2] == "| all | 4.0 | 6.0 | 10.0 | 20.0 | 50% |"
    assert lines[-1] == "| linked into another | 0.0 | 3.0 | 2.0 | 5.0 | 12% |"
    assert "9 code libraries" in lines[1] and "4 of them" in lines[1]
    assert compile_time.llvm_lines({"compile_s": 1.0}) == []
    assert compile_time.llvm_lines({"compile_s": 1.0, "llvm": {"all": {}}}) == []


def test_the_reads_report_reads_each_file_three_ways_on_a_fresh_cache_a_round(monkeypatch,
                                                                              tmp_path):
    """``compile_time.py --reads``: per round and file one fresh empty cache, read by NumPy,
    by the parser cold and by the parser warm, in that order; the table's cells are the
    medians and ranges of those reads."""
    from bench import compile_time
    calls = []

    def measure(arg, cache, child):
        path, way = arg.rsplit(",", 1)
        calls.append((path, way, cache, child))
        read = {"numpy": 0.2, "kernel-cold": 5.0, "kernel-warm": 0.4}[way] * len(calls)
        return {"read_s": read, "again_s": read / 4, "compiled": way != "numpy",
                "peak_mb": 100.0 + len(calls),
                "rows": 100, "bytes": 2_000_000, "import_s": 0.3}
    monkeypatch.setattr(compile_time, "measure", measure)
    lines = compile_time.reads_report(["/d/a/train.txt", "/d/b/train.txt"], rounds=2)
    assert [(c[0][3], c[1]) for c in calls] == [
        (p, w) for _ in range(2) for p in "ab" for w in ("numpy", "kernel-cold", "kernel-warm")]
    assert all(c[3] is compile_time.READ_CHILD for c in calls)
    caches = [c[2] for c in calls]
    assert caches[0] == caches[1] == caches[2] != caches[3] and len(set(caches)) == 4
    rows = [line for line in lines if line.startswith("| a/") or line.startswith("| b/")]
    # file a: calls 1-3 (round 1) and 7-9 (round 2)
    assert rows[0] == ("| a/train.txt | 2.0 | 100 | 0.80 (0.20-1.40) | 25.00 (10.00-40.00) | "
                       "2.40 (1.20-3.60) | 0.20 (0.05-0.35) | 0.60 (0.30-0.90) | 104 | 106 |")
    assert len(rows) == 2


def test_many_core_fits_the_network_at_the_width_asked_and_tabulates_layouts():
    """``many_core.py``: a layout name's batches_in_flight, one fit of the network alone at
    the width ``--hidden`` gives, and the table's ratios to one batch at a time."""
    from bench import many_core
    from slide.synthetic import generate
    assert many_core.layout_value("half", 8) == 4 and many_core.layout_value("3", 8) == 3
    assert many_core.layout_value("auto", 2) >= 1
    data = generate("tiny", n_train=300, n_test=50, seed=0)
    r = many_core.one_fit(data, 1, 1, 0, 1, hidden=(8,))
    assert r["samples"] == 300 and r["samples_per_s"] > 0 and 0 <= r["p_at_1"] <= 1
    rows = [dict(data="d", threads=2, batches_in_flight=w, samples_per_s=s, fit_seconds=1.0,
                 p_at_1=0.5, p_at_5=0.3, psp_at_5=0.2) for w, s in ((1, 100.0), (1, 300.0),
                                                                     (2, 220.0), (2, 220.0))]
    table = many_core.table(rows).splitlines()
    assert table[2].startswith("| d | 2 | 1 | 200 (141) | 1.00 |")
    assert table[3].startswith("| d | 2 | 2 | 220 (0) | 1.10 |")


def test_many_core_times_a_batchs_parts_and_passes_settings_to_every_fit():
    """``many_core.py --phases``: a batch's claim, bind and run timed at each thread count
    (positive, the compiled run the longest on a real batch), tabulated; ``--param``'s
    NAME=VALUE read as a literal and given to the fit."""
    from bench import many_core
    from slide.synthetic import generate
    assert many_core.parse_param("learning_rate=0.002") == ("learning_rate", 0.002)
    assert many_core.parse_param("optimizer=lazy_adam") == ("optimizer", "lazy_adam")
    with pytest.raises(SystemExit):
        many_core.parse_param("learning_rate")
    data = generate("tiny", n_train=600, n_test=50, seed=0)
    phases = many_core.batch_phases(data, [1], 4, hidden=(8,))
    assert [r["threads"] for r in phases] == [1] and phases[0]["batches"] == 4
    assert all(phases[0][k] > 0 for k in ("claim_ms", "bind_ms", "run_ms"))
    table = many_core.phase_table([dict(phases[0], data="tiny")])
    assert "| tiny | 1 |" in table
    bad = dict(optimizer="not-an-optimizer")
    with pytest.raises(ValueError):
        many_core.one_fit(data, 1, 1, 0, 1, hidden=(8,), params=bad)
