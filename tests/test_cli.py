"""The ``slide`` command line, end to end on tiny synthetic sets with tiny networks and one thread.

Most commands run in-process through ``main(argv)`` (no interpreter start-up per call); the
signal tests and the ``python -m slide.cli`` check run real subprocesses.
"""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from slide import cli
from slide.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY = """
output_dir = "{out}"
[data]
preset = "tiny"
eval_points = 100
[model]
hidden_sizes = [16]
[lsh]
family = "simhash"
K = 4
L = 6
range_pow = 6
bucket_size = 32
[sampler]
kind = "vanilla"
budget = 40
min_active = 50
[optimizer]
learning_rate = 2e-3
lr_schedule = "constant"
[schedule]
rehash_period = 7
rebuild_period = 23
[train]
epochs = {epochs}
batch_size = 32
threads = 1
seed = 3
eval_every_batches = {eval_every}
checkpoint_every_batches = {ckpt_every}
keep_checkpoints = 2
log_every_seconds = 0.2
baseline = "none"
"""


def tiny_config(tmp_path, name="run", epochs=1, eval_every=5, ckpt_every=5):
    out = tmp_path / name
    path = tmp_path / f"{name}.toml"
    path.write_text(TINY.format(out=out, epochs=epochs, eval_every=eval_every,
                                ckpt_every=ckpt_every))
    return str(path), str(out)


def run_cli(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def metrics(run_dir):
    return [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]


def checkpoints(run_dir):
    d = os.path.join(run_dir, "checkpoints")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e["NUMBA_NUM_THREADS"] = "1"
    return e


# ---------------------------------------------------------------------------------------------

def test_python_m_entry_point_and_help():
    r = subprocess.run([sys.executable, "-m", "slide.cli", "--help"], capture_output=True,
                       text=True, env=env(), timeout=120)
    assert r.returncode == 0
    for cmd in ("train", "evaluate", "predict", "generate", "plot", "compile", "info"):
        assert cmd in r.stdout
    r = subprocess.run([sys.executable, "-m", "slide.cli", "train"], capture_output=True,
                       text=True, env=env(), timeout=120)
    # no configuration and no data: exit 2, saying how to give the data
    assert r.returncode == 2 and "no data" in r.stderr and "--train" in r.stderr


def test_train_from_data_paths_alone(tmp_path, capsys):
    """slide train --train T --test T: no configuration file, every key at its default
    (a --set still wins over --train; a path that reads like a number stays a path)."""
    from slide.synthetic import generate, write_dataset
    data = tmp_path / "1e3"                 # a TOML literal as a directory name
    write_dataset(str(data), *generate("tiny", seed=0))
    out = tmp_path / "run"
    code, _, err = run_cli(["train", "--train", str(data / "train.txt"), "--test",
                            str(data / "test.txt"), "--set", f"output_dir={out}",
                            "--set", "model.hidden_sizes=[16]", "--set", "train.threads=1"],
                           capsys)
    assert code == 0, err
    from slide.config import load_config
    resolved = load_config(os.path.join(out, "config.toml"))
    assert resolved["data"]["train"] == str(data / "train.txt")
    assert resolved["data"]["test"] == str(data / "test.txt")
    assert resolved["lsh"]["K"] == 6 and resolved["train"]["epochs"] == "auto"   # defaults
    assert json.load(open(os.path.join(out, "summary.json")))["slide"]["batches"] > 0
    code, _, err = run_cli(["train", "--train", str(tmp_path / "missing.txt"), "--set",
                            f"data.train={data / 'train.txt'}", "--set",
                            f"output_dir={tmp_path / 'run2'}", "--set", "train.epochs=1",
                            "--set", "model.hidden_sizes=[16]", "--set", "train.threads=1"],
                           capsys)
    assert code == 0, err


def test_train_epochs_auto_is_resolved_from_the_data(tmp_path, capsys):
    # 600 training rows in batches of 32: 19 an epoch, so "auto" is the cap, 8 epochs
    cfg, run = tiny_config(tmp_path, epochs='"auto"', eval_every=0, ckpt_every=0)
    code, out, err = run_cli(["train", "--config", cfg], capsys)
    assert code == 0, err
    assert "152 batches (8 epoch(s) of 19)" in out
    summary = json.load(open(os.path.join(run, "summary.json")))
    assert summary["slide"]["batches"] == 152 and summary["slide"]["epochs"] == 8
    cfg, _ = tiny_config(tmp_path, "bad", epochs='"many"')
    code, out, err = run_cli(["train", "--config", cfg], capsys)
    assert code != 0 and "train.epochs" in err and "'auto'" in err


def test_train_checkpoint_resume_evaluate(tmp_path, capsys):
    cfg, run = tiny_config(tmp_path, epochs=1)
    code, out, err = run_cli(["train", "--config", cfg], capsys)
    assert code == 0, err
    # run directory layout
    for name in ("config.toml", "metrics.jsonl", "model.slide", "summary.json",
                 "inv_propensity.npy", "data/train.txt", "data/test.txt"):
        assert os.path.exists(os.path.join(run, name)), name
    assert len(checkpoints(run)) == 2  # keep_checkpoints = 2 (19 batches: 15 and the final 19)
    assert checkpoints(run)[-1] == "ckpt-000000019.slide"
    # the model file is a second name of the final checkpoint, not a second write of it
    assert os.path.samefile(os.path.join(run, "model.slide"),
                            os.path.join(run, "checkpoints", "ckpt-000000019.slide"))
    recs = metrics(run)
    # the last batch twice: the network alone, then with the neighbour vote fitted after it
    assert [r["batch"] for r in recs] == [5, 10, 15, 19, 19]
    assert [r["neighbour_vote"] for r in recs] == [False] * 4 + [True]
    for r in recs:
        for key in ("epoch", "train_seconds", "loss", "P@1", "P@3", "P@5", "active_mean",
                    "rehashes", "rebuilds"):
            assert key in r
        assert 0.0 <= r["P@1"] <= 1.0
    assert all(np.isfinite(r["loss"]) for r in recs[:4])
    secs = [r["train_seconds"] for r in recs]
    assert secs == sorted(secs) and secs[0] > 0
    summary = json.load(open(os.path.join(run, "summary.json")))
    assert summary["slide"]["batches"] == 19 and summary["slide"]["P@1"] == recs[-2]["P@1"]
    assert summary["slide"]["train_seconds"] == pytest.approx(recs[-2]["train_seconds"],
                                                              abs=1e-3)
    assert summary["slide"]["post_fit"]["P@1"] == recs[-1]["P@1"]
    assert "P@1" in out  # the final comparison line
    # the resolved config is valid TOML naming every default
    from slide.config import load_config
    resolved = load_config(os.path.join(run, "config.toml"))
    assert resolved["lsh"]["K"] == 4 and resolved["train"]["batch_size"] == 32

    # --resume with more epochs continues from the final checkpoint
    code, out, err = run_cli(["train", "--config", cfg, "--resume", "--set", "train.epochs=2"],
                             capsys)
    assert code == 0, err
    assert "resuming from" in out and "batch 19" in out
    recs2 = metrics(run)
    assert [r["batch"] for r in recs2] == [5, 10, 15, 19, 19, 20, 25, 30, 35, 38, 38]
    assert recs2[:5] == recs  # the first epoch's records are kept unchanged
    assert checkpoints(run)[-1] == "ckpt-000000038.slide"

    # evaluate: table, then JSON
    test = os.path.join(run, "data", "test.txt")
    code, out, err = run_cli(["evaluate", "--model", run, "--data", test], capsys)
    assert code == 0, err
    assert "P " in out and "nDCG" in out and "PSP" in out
    code, out, err = run_cli(["evaluate", "--model", run, "--data", test, "--json",
                              "--out", str(tmp_path / "ev.json")], capsys)
    assert code == 0, err
    res = json.loads(out)
    assert res == json.load(open(tmp_path / "ev.json"))
    for k in (1, 3, 5):
        for m in ("P", "nDCG", "PSP"):
            assert 0.0 <= res[f"{m}@{k}"] <= 1.0
    assert res["points"] == 200 and res["inference"] == "exact"
    assert "training labels" in res["propensities"]
    # P@1 of the evaluate command agrees with the model's own scoring of the same file
    import slide
    from slide.data import read_xc
    X, Y = read_xc(test)
    model = slide.load(os.path.join(run, "model.slide"))
    assert res["P@1"] == pytest.approx(model.score(X, Y))
    # LSH inference runs too and reports itself
    code, out, err = run_cli(["evaluate", "--model", os.path.join(run, "model.slide"),
                              "--data", test, "--sparse", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["inference"] == "sparse (serving index)"


def test_existing_run_needs_resume_or_overwrite(tmp_path, capsys):
    cfg, run = tiny_config(tmp_path, epochs=1, eval_every=0, ckpt_every=0)
    code, out, err = run_cli(["train", "--config", cfg, "--resume"], capsys)
    assert code == cli.EXIT_CHECKPOINT and "nothing to resume" in err
    assert run_cli(["train", "--config", cfg], capsys)[0] == 0
    # eval_every 0: evaluated at the end only, the network alone and with the vote fitted after
    assert [r["batch"] for r in metrics(run)] == [19, 19]
    assert checkpoints(run) == ["ckpt-000000019.slide"]
    code, out, err = run_cli(["train", "--config", cfg], capsys)
    assert code == cli.EXIT_USAGE and "--resume" in err and "--overwrite" in err
    # --overwrite starts over, generated data included (here a half-size set)
    code, out, err = run_cli(["train", "--config", cfg, "--overwrite", "--set", "data.scale=0.5"],
                             capsys)
    assert code == 0, err
    with open(os.path.join(run, "data", "train.txt")) as f:
        assert f.readline().split() == ["300", "750", "100"]
    assert [r["batch"] for r in metrics(run)] == [10, 10]


def test_resume_with_changed_config_is_refused(tmp_path, capsys):
    cfg, run = tiny_config(tmp_path, epochs=1)
    assert run_cli(["train", "--config", cfg], capsys)[0] == 0
    before = open(os.path.join(run, "config.toml")).read()
    code, out, err = run_cli(["train", "--config", cfg, "--resume", "--set", "lsh.L=5",
                              "--set", "optimizer.learning_rate=0.5"], capsys)
    assert code == cli.EXIT_CHECKPOINT
    assert "lsh.L" in err and "optimizer.learning_rate" in err and "refusing" in err
    assert open(os.path.join(run, "config.toml")).read() == before
    assert "Traceback" not in err
    # without config.toml the checkpoint's own copy of the configuration is compared
    os.remove(os.path.join(run, "config.toml"))
    code, out, err = run_cli(["train", "--config", cfg, "--resume", "--set", "lsh.L=5"], capsys)
    assert code == cli.EXIT_CHECKPOINT and "lsh.L" in err and "ckpt-" in err


def test_checkpoint_of_another_format_version_is_refused(tmp_path, capsys):
    cfg, run = tiny_config(tmp_path, epochs=1, eval_every=0, ckpt_every=0)
    assert run_cli(["train", "--config", cfg], capsys)[0] == 0
    model = os.path.join(run, "model.slide")
    with np.load(model) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays["__meta__"].tobytes().decode())
    meta["version"] = 99
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    other = str(tmp_path / "future.slide")
    with open(other, "wb") as f:
        np.savez(f, **arrays)
    test = os.path.join(run, "data", "test.txt")
    code, out, err = run_cli(["evaluate", "--model", other, "--data", test], capsys)
    assert code == cli.EXIT_CHECKPOINT and "version" in err and "Traceback" not in err
    # a model away from its run directory: PSP@k falls back to the evaluated file's labels
    import shutil
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(model, alone / "m.slide")
    code, out, err = run_cli(["evaluate", "--model", str(alone / "m.slide"), "--data", test,
                              "--json"], capsys)
    assert code == 0, err
    assert "note: PSP@k uses inverse propensities from the labels of" in err
    assert test in json.loads(out)["propensities"]


def test_bad_config_reports_every_problem_before_reading_data(tmp_path, capsys):
    # a training file whose body is broken: if the CLI read it, the exit code would be 3
    train = tmp_path / "train.txt"
    train.write_text("3 20 10\n0 1:x\n")
    bad = tmp_path / "bad.toml"
    bad.write_text(f"""
output_dir = "{tmp_path / 'out'}"
[data]
train = "{train}"
test = "{tmp_path / 'no-such-test.txt'}"
[lsh]
family = "dwta"
K = 9
range_pow = 18
bucket_sise = 64
[sampler]
budget = 11
[train]
epochs = 0
batch_size = "big"
""")
    code, out, err = run_cli(["train", "--config", str(bad), "--set", "lsh.range_pow=40"],
                             capsys)
    assert code == cli.EXIT_USAGE == 2
    for key in ("lsh.bucket_sise", "data.test", "train.epochs", "train.batch_size",
                "lsh.range_pow"):
        assert f"  {key}: " in err, key
    assert "did you mean 'lsh.bucket_size'" in err
    assert "Traceback" not in err
    assert not os.path.exists(tmp_path / "out")  # nothing was created
    # with the range fixed, the hash-bit and label-count checks show up (K=9 x 3 bits > 18)
    code, out, err = run_cli(["train", "--config", str(bad), "--set", "lsh.range_pow=18",
                              "--set", "lsh.bucket_sise=1", "--set", "train.epochs=1",
                              "--set", "train.batch_size=4"], capsys)
    assert code == 2
    assert "  lsh.K: " in err and "  sampler.budget: " in err and "(10)" in err


def test_bad_data_file_gives_path_line_token(tmp_path, capsys):
    train = tmp_path / "train.txt"
    train.write_text("3 20 10\n0,1 1:0.5 4:1.0\n2 3:0.25\n1 7:zz\n")
    cfg, _ = tiny_config(tmp_path)
    # "--set data.preset=" unsets the preset, so the files of data.train are used instead
    code, out, err = run_cli(["train", "--config", cfg, "--set", "data.preset=",
                              "--set", f"data.train={train}", "--set", "sampler.budget=5",
                              "--set", "sampler.min_active=6"], capsys)
    assert code == cli.EXIT_DATA == 3
    assert str(train) in err and "line 4" in err and "zz" in err
    assert "Traceback" not in err


def test_truncated_and_corrupt_checkpoints(tmp_path, capsys):
    cfg, run = tiny_config(tmp_path, epochs=1)
    assert run_cli(["train", "--config", cfg], capsys)[0] == 0
    model = os.path.join(run, "model.slide")
    test = os.path.join(run, "data", "test.txt")
    size = os.path.getsize(model)
    with open(model, "r+b") as f:
        f.truncate(size // 2)
    code, out, err = run_cli(["evaluate", "--model", model, "--data", test], capsys)
    assert code == cli.EXIT_CHECKPOINT == 4
    assert model in err and "Traceback" not in err
    # the newest checkpoint truncated: --resume says so and falls back to the previous one
    ck = [os.path.join(run, "checkpoints", n) for n in checkpoints(run)]
    assert len(ck) == 2
    with open(ck[-1], "r+b") as f:
        f.truncate(100)
    code, out, err = run_cli(["train", "--config", cfg, "--resume"], capsys)
    assert code == 0, err
    assert "unusable" in err and "falling back" in err and "batch 15" in out
    assert [r["batch"] for r in metrics(run)] == [5, 10, 15, 19, 19]
    assert checkpoints(run) == ["ckpt-000000015.slide", "ckpt-000000019.slide",
                                "ckpt-000000019.slide.corrupt"]
    # garbage in every checkpoint: refused with a clear error
    for p in [os.path.join(run, "checkpoints", n) for n in checkpoints(run)
              if n.endswith(".slide")]:
        with open(p, "wb") as f:
            f.write(b"not a checkpoint")
    code, out, err = run_cli(["train", "--config", cfg, "--resume"], capsys)
    assert code == 4 and "no usable checkpoint" in err


def test_predict_streams_k_labels_per_line(tmp_path, capsys):
    cfg, run = tiny_config(tmp_path, epochs=1, eval_every=0, ckpt_every=0)
    assert run_cli(["train", "--config", cfg], capsys)[0] == 0
    test = os.path.join(run, "data", "test.txt")
    out_path = tmp_path / "preds.txt"
    code, out, err = run_cli(["predict", "--model", run, "--data", test, "--k", "3",
                              "--chunk-size", "7", "--out", str(out_path)], capsys)
    assert code == 0, err
    lines = out_path.read_text().splitlines()
    assert len(lines) == 200
    import slide
    from slide.data import read_xc
    model = slide.load(os.path.join(run, "model.slide"))
    X, _ = read_xc(test)
    top = model.predict_topk(X, k=3)
    assert model.rank_.memory is not None          # the default: with the neighbour vote
    scores = model.predict_proba(X)                   # the blend's probabilities
    for i, line in enumerate(lines):
        pairs = [tok.split(":") for tok in line.split()]
        assert len(pairs) == 3
        labels = [int(a) for a, _ in pairs]
        assert labels == list(top[i])
        vals = [float(b) for _, b in pairs]
        assert vals == sorted(vals, reverse=True)
        assert np.allclose(vals, scores[i, labels], rtol=1e-4, atol=1e-6)
    # to stdout, features-only lines (empty label field) are fine
    src = tmp_path / "x.txt"
    src.write_text("2 1500 200\n 3:0.5 10:0.25\n 7:1.0\n")
    code, out, err = run_cli(["predict", "--model", run, "--data", str(src), "--k", "2"],
                             capsys)
    assert code == 0, err
    assert [len(line.split()) for line in out.splitlines()] == [2, 2]
    # an error in a later chunk names the real line of the file
    bad = tmp_path / "bad.txt"
    bad.write_text("5 1500 200\n 1:1\n 2:1\n 3:1\n 4:oops\n 5:1\n")
    code, out, err = run_cli(["predict", "--model", run, "--data", str(bad), "--chunk-size",
                              "2", "--out", str(tmp_path / "p2.txt")], capsys)
    assert code == 3 and "line 5" in err and "oops" in err and str(bad) in err
    assert not os.path.exists(tmp_path / "p2.txt")  # no half-written output
    # a header announcing more points than the file has
    short = tmp_path / "short.txt"
    short.write_text("4 1500 200\n 1:1\n")
    code, out, err = run_cli(["predict", "--model", run, "--data", str(short)], capsys)
    assert code == 3 and "announces 4 points" in err


def test_compile_fills_the_cache_ahead_of_a_run(tmp_path, capsys, monkeypatch):
    """slide compile: the kernels of a configuration's fit (and of the XC reader, for a run
    on files), reading no data; a second time in the process there is nothing left to do."""
    from slide import warmup
    monkeypatch.setattr(warmup, "_WARMED", {})     # as in a fresh process
    cfg, run = tiny_config(tmp_path)
    code, out, err = run_cli(["compile", "--config", cfg], capsys)
    assert code == 0, err
    # (what an earlier test compiled in this process is ready at once)
    assert "[slide] compiling kernels ... " in out and ("kernel signatures: " in out or
                                                        "already compiled" in out)
    assert "[reader]" not in out and "done in" in out          # a synthetic set: no reader
    assert not os.path.exists(run)                              # no run directory either
    # the same fit on files that need not exist yet: only the reader is new
    code, out, err = run_cli(["compile", "--config", cfg, "--set", "data.preset=",
                              "--set", f"data.train={tmp_path / 'later' / 'train.txt'}"],
                             capsys)
    assert code == 0, err
    assert "[reader] compiling kernels ... " in out
    assert "[slide] compiling kernels ... already compiled in this process" in out
    code, out, err = run_cli(["compile", "--config", cfg], capsys)
    assert code == 0 and "already compiled in this process" in out
    # no data source is fine; a bad key is not
    from slide.config import load_config
    assert load_config(None, require_data=False)["data"]["train"] is None
    code, _, err = run_cli(["compile", "--set", "lsh.KK=3"], capsys)
    assert code == 2 and "lsh.KK" in err


def test_compile_hands_the_dense_baseline_to_the_slide_phases_helper(tmp_path, capsys,
                                                                     monkeypatch):
    """With a dense baseline, ``slide compile`` warms slide's phase with the baseline's fit
    as the one that follows (the compile helper compiles it there on a cold cache), then the
    baseline's own phase with nothing after it."""
    from slide import warmup
    calls = []

    def record(model, X=None, Y=None, then=()):
        calls.append((model.sampler, [m.sampler for m in then]))
        return 0.0
    monkeypatch.setattr(warmup, "warm_up", record)
    cfg, _ = tiny_config(tmp_path)
    code, out, err = run_cli(["compile", "--config", cfg, "--set", "train.baseline=dense"],
                             capsys)
    assert code == 0, err
    assert calls == [(calls[0][0], ["dense"]), ("dense", [])] and calls[0][0] != "dense"


def test_generate_writes_a_readable_set(tmp_path, capsys):
    out = tmp_path / "gen"
    code, o, err = run_cli(["generate", "--preset", "tiny", "--scale", "0.5", "--seed", "4",
                            "--set", "n_train=120", "--out", str(out)], capsys)
    assert code == 0, err
    from slide.data import read_xc
    X, Y = read_xc(str(out / "train.txt"))
    Xt, Yt = read_xc(str(out / "test.txt"))
    assert X.shape[0] == 120 and Xt.shape[0] == 100  # n_test 200 x 0.5
    assert X.shape[1] == Xt.shape[1] == 750 and Y.shape[1] == Yt.shape[1] == 100
    assert (np.diff(Y.indptr) >= 1).all()
    code, o, err = run_cli(["generate", "--preset", "tiyn", "--out", str(out)], capsys)
    assert code == 2 and "unknown preset" in err
    code, o, err = run_cli(["generate", "--preset", "tiny", "--set", "n_trian=5",
                            "--out", str(out)], capsys)
    assert code == 2 and "n_trian" in err


def test_plot_writes_png_and_explains_missing_matplotlib(tmp_path, capsys, monkeypatch):
    cfg, run = tiny_config(tmp_path, epochs=1)
    assert run_cli(["train", "--config", cfg, "--set", "train.baseline=dense"], capsys)[0] == 0
    assert os.path.exists(os.path.join(run, "baseline-dense", "metrics.jsonl"))
    summary = json.load(open(os.path.join(run, "summary.json")))
    assert summary["dense-baseline"]["sampler"] == "dense"
    assert summary["dense-baseline"]["batches"] == summary["slide"]["batches"]
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    code, out, err = run_cli(["plot", run], capsys)
    assert code == cli.EXIT_ERROR and "needs matplotlib" in err
    monkeypatch.undo()     # matplotlib is a dependency: the PNG is always checked
    png = tmp_path / "p.png"
    code, out, err = run_cli(["plot", run, "--out", str(png)], capsys)
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "2 curves" in out  # the run and its dense baseline
    code, out, err = run_cli(["plot", str(tmp_path)], capsys)
    assert code == 2 and "metrics.jsonl" in err


def test_divergence_stops_with_the_batch_named(tmp_path, capsys):
    import re
    import slide
    cfg, run = tiny_config(tmp_path, epochs=3, eval_every=0, ckpt_every=1)
    code, out, err = run_cli(["train", "--config", cfg, "--set", "optimizer.learning_rate=1e30"],
                             capsys)
    assert code == cli.EXIT_DIVERGED == 5, err
    assert "diverged" in err and re.search(r"at batch \d+", err) and "Traceback" not in err
    assert not os.path.exists(os.path.join(run, "model.slide"))
    # the last good checkpoint is named, still on disk, and loads
    m = re.search(r"last good checkpoint is (\S+?);", err)
    assert m, err
    batch = int(re.search(r"at batch (\d+)", err).group(1))
    model = slide.load(m.group(1))
    assert model.batches_ == batch - 1


# ---------------------------------------------------------------------------------------------
# signals: a subprocess is interrupted after its first checkpoint and resumed

def _spawn(cfg, *extra):
    return subprocess.Popen([sys.executable, "-m", "slide.cli", "train", "--config", cfg,
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env())


def _wait_for_checkpoint(proc, run, newer_than=None, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        names = checkpoints(run)
        if names and (newer_than is None or names[-1] > newer_than):
            return names[-1]
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"training ended before a checkpoint appeared:\n{out}\n{err}")
        time.sleep(0.02)
    proc.kill()
    raise AssertionError("no checkpoint appeared")


def _final_scores(run):
    import slide
    from slide.data import read_xc
    X, _ = read_xc(os.path.join(run, "data", "test.txt"))
    return slide.load(os.path.join(run, "model.slide")).predict_scores(X)


def _quality(records):
    keys = ("batch", "epoch", "samples", "loss", "P@1", "P@3", "P@5", "active_mean",
            "rehashes", "rebuilds", "rehashes_total", "rebuilds_total")
    return [{k: r[k] for k in keys} for r in records]


def test_interrupted_run_resumes_to_the_same_result(tmp_path, capsys):
    # enough batches that the run is still going when its first checkpoints appear: 1,900
    # batches of about 3 ms (vanilla sampler, a rehash every 7 batches) on the 2-core VM, a
    # checkpoint every 400, so the end comes seconds after the second checkpoint, and still
    # ~0.3 s after it were the batches ten times as fast; the test polls every 20 ms
    epochs = 100
    cfg, run = tiny_config(tmp_path, "interrupted", epochs=epochs, eval_every=500,
                           ckpt_every=400)
    ref_cfg, ref_run = tiny_config(tmp_path, "reference", epochs=epochs, eval_every=500,
                                   ckpt_every=400)

    proc = _spawn(cfg)
    first = _wait_for_checkpoint(proc, run)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == cli.EXIT_SIGINT == 130, err
    assert "Ctrl-C" in err and "checkpoint written" in err and "--resume" in err
    stopped_at = checkpoints(run)[-1]
    assert stopped_at >= first and stopped_at in err  # the message names the checkpoint
    assert not os.path.exists(os.path.join(run, "model.slide"))

    proc = _spawn(cfg, "--resume")
    _wait_for_checkpoint(proc, run, newer_than=stopped_at)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == cli.EXIT_SIGTERM == 143, err
    assert "SIGTERM" in err

    code, out, err = run_cli(["train", "--config", cfg, "--resume"], capsys)
    assert code == 0, err
    assert run_cli(["train", "--config", ref_cfg], capsys)[0] == 0

    total = epochs * 19
    assert metrics(run)[-1]["batch"] == metrics(ref_run)[-1]["batch"] == total
    # same evaluations at the same batches, and bit-identical final scores
    assert _quality(metrics(run)) == _quality(metrics(ref_run))
    a, b = _final_scores(run), _final_scores(ref_run)
    assert a.dtype == b.dtype and np.array_equal(a, b)


def test_batches_in_flight_evaluate_and_checkpoint_between_waves(tmp_path, capsys):
    """With several batches in flight the callback comes once a wave: evaluations and
    checkpoints still come whenever a wave passes their period, at the wave's last batch,
    and the run ends with every batch counted once; the checkpoint resumes."""
    cfg, run = tiny_config(tmp_path, "inflight", epochs=3, eval_every=5, ckpt_every=5)
    with open(cfg) as f:
        text = f.read().replace("threads = 1", "threads = 2\nbatches_in_flight = 2")
    with open(cfg, "w") as f:
        f.write(text)
    code, out, err = run_cli(["train", "--config", cfg], capsys)
    assert code == 0, err
    batches = [m["batch"] for m in metrics(run) if "batch" in m]
    assert batches[-1] == 3 * 19 and batches == sorted(batches)
    assert checkpoints(run)
    # the run ended: resuming it trains nothing more and succeeds
    code, out, err = run_cli(["train", "--config", cfg, "--resume"], capsys)
    assert code == 0, err
    assert [m["batch"] for m in metrics(run) if "batch" in m][-1] == 3 * 19


def test_search_table_trains_the_winner_and_resume_keeps_it(tmp_path, capsys):
    """[search]: the trials are searched (fused) before the run, written to search.json, and
    the run trains the winner; a resumed run reads the winner back instead of searching."""
    cfg, out = tiny_config(tmp_path, epochs=1, ckpt_every=0)
    with open(cfg, "a") as f:
        f.write('\n[search]\n"optimizer.learning_rate" = [1e-4, 2e-3]\n')
    code, text, err = run_cli(["train", "--config", cfg], capsys)
    assert code == 0, err
    found = json.loads(open(os.path.join(out, "search.json")).read())
    assert [t["values"]["optimizer.learning_rate"] for t in found["trials"]] == [1e-4, 2e-3]
    assert found["held_out_rows"] > 0 and "search: 2 trials" in text
    best = found["best"]["optimizer.learning_rate"]
    assert max(found["trials"], key=lambda t: t["held_out_P@5"])["values"] == found["best"]
    # one epoch: halving scores both trials at its end, and keeps one
    assert len({t["batches"] for t in found["trials"]}) == 1 and "after" in text
    model = slide_load(os.path.join(out, "model.slide"))
    assert model.learning_rate == best
    code, text, err = run_cli(["train", "--config", cfg, "--resume"], capsys)
    assert code == 0, err
    assert "the winner of search.json" in text


def test_a_diverging_search_trial_is_named_and_the_run_goes_on(tmp_path, capsys):
    cfg, out = tiny_config(tmp_path, epochs=1, ckpt_every=0)
    with open(cfg, "a") as f:
        f.write('\n[search]\n"optimizer.learning_rate" = [2e-3, 1e38]\n'
                '"optimizer.name" = ["sgd"]\n')
    code, text, err = run_cli(["train", "--config", cfg], capsys)
    assert code == 0, err
    found = json.loads(open(os.path.join(out, "search.json")).read())
    assert [t["held_out_P@5"] is None for t in found["trials"]] == [False, True]
    assert found["best"]["optimizer.learning_rate"] == 2e-3 and "diverged after" in text


def slide_load(path):
    import slide
    return slide.load(path)


def test_bad_search_tables_are_named(tmp_path, capsys):
    cfg, _ = tiny_config(tmp_path)
    with open(cfg, "a") as f:
        f.write('\n[search]\n"optimizer.learning_rte" = [1e-3]\n"model.neighbours" = [5]\n'
                '"train.batch_size" = []\n"optimizer.learning_rate" = [-1.0]\n')
    code, _, err = run_cli(["train", "--config", cfg], capsys)
    assert code == 2
    for word in ("search.optimizer.learning_rte: not a model parameter",
                 "did you mean 'optimizer.learning_rate'", "search.model.neighbours: not searched",
                 "search.train.batch_size: must be a non-empty array",
                 "search.optimizer.learning_rate[0]"):
        assert word in err, err
    cfg, _ = tiny_config(tmp_path, name="sharded")
    with open(cfg, "a") as f:
        f.write('\n[distributed]\nshards = 2\n[search]\n"optimizer.learning_rate" = [1e-3]\n')
    code, _, err = run_cli(["train", "--config", cfg], capsys)
    assert code == 2 and "search: trains its trials in one process" in err, err


def test_a_run_stopped_after_its_batches_resumes_into_the_ranking_stages(
        tmp_path, capsys, monkeypatch):
    """Killed after its last batch's checkpoint, while fit built the neighbour vote: the
    resumed run builds it (it used to save the network alone as the final model) and ends
    where the uninterrupted run does."""
    import slide
    from slide.cli.common import _has_neighbour_memory
    cfg, run = tiny_config(tmp_path, "stopped", epochs=1, ckpt_every=19)
    ref_cfg, ref_run = tiny_config(tmp_path, "whole", epochs=1, ckpt_every=19)
    build = slide.SlideClassifier._build_memory

    def killed(self, X, *args, **kwargs):
        if X.shape[0] < 500:            # the warm-up's tiny fit compiles it
            return build(self, X, *args, **kwargs)
        raise KeyboardInterrupt         # as a second Ctrl-C would: no checkpoint written
    monkeypatch.setattr(slide.SlideClassifier, "_build_memory", killed)
    assert run_cli(["train", "--config", cfg], capsys)[0] == cli.EXIT_SIGINT
    assert checkpoints(run) == ["ckpt-000000019.slide"]
    assert not os.path.exists(os.path.join(run, "model.slide"))
    monkeypatch.setattr(slide.SlideClassifier, "_build_memory", build)
    code, out, err = run_cli(["train", "--config", cfg, "--resume"], capsys)
    assert code == 0, err
    assert run_cli(["train", "--config", ref_cfg], capsys)[0] == 0
    a, b = (slide.load(os.path.join(r, "model.slide")) for r in (run, ref_run))
    assert _has_neighbour_memory(a)
    from slide.data import read_xc
    X, _ = read_xc(os.path.join(run, "data", "test.txt"))
    np.testing.assert_array_equal(a.predict_topk_scored(X, k=5)[1],
                                  b.predict_topk_scored(X, k=5)[1])
    assert _quality(metrics(run)) == _quality(metrics(ref_run))
