"""``slide train`` with ``model.n_models`` >= 2 (``slide.cli.ensemble``): the members of a
``SlideEnsemble`` one after another, each in its own directory, the ensemble as the run's
model file; evaluate, predict, plot and resume on it. Tiny synthetic set, one thread."""
import json
import os
import shutil
import signal

import numpy as np
import pytest
from sklearn.pipeline import Pipeline

import slide
from slide import config as config_mod
from slide.data import read_xc
from slide.ensemble import SlideEnsemble, member_seed
from slide.synthetic import generate
from test_cli import _spawn, _wait_for_checkpoint, run_cli, tiny_config


@pytest.fixture(scope="module")
def ensemble_run(tmp_path_factory):
    """A finished two-member run (``model.n_models=2``) and its stdout."""
    tmp = tmp_path_factory.mktemp("ens")
    # evaluated at the end only: an evaluation syncs the optimizer (SlideClassifier.sync), so
    # the Python API's fit below trains the same bits as a run evaluated at its end
    cfg, run = tiny_config(tmp, epochs=1, eval_every=0)
    from slide.cli import main
    import io
    from contextlib import redirect_stdout
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["train", "--config", cfg, "--set", "model.n_models=2"])
    assert code == 0
    return cfg, run, out.getvalue()


def test_members_train_one_after_another_into_their_directories(ensemble_run):
    cfg, run, out = ensemble_run
    for k in (0, 1):
        member = os.path.join(run, f"member-{k}")
        for name in ("metrics.jsonl", "model.slide", "checkpoints"):
            assert os.path.exists(os.path.join(member, name)), (k, name)
        # member k is seeded as SlideEnsemble seeds its member k (train.seed = 3)
        assert slide.load(os.path.join(member, "model.slide")).random_state == \
            member_seed(3, k)
    model = slide.load(os.path.join(run, "model.slide"))
    assert isinstance(model, SlideEnsemble) and len(model.members_) == 2
    assert model.seed_ == 3 and not model._is_fused()
    # the ensemble's file is for predicting: the members' moments are in their checkpoints only
    assert not any(m.optimizer_.has_state for m in model.members_)
    assert slide.load(os.path.join(run, "member-0", "model.slide")).optimizer_.has_state
    # the run's own log: one line, the ensemble on the evaluation sample
    [rec] = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    summary = json.load(open(os.path.join(run, "summary.json")))
    assert rec["members"] == 2 and rec["batch"] == 38
    assert summary["ensemble"]["P@1"] == rec["P@1"] and summary["ensemble"]["members"] == 2
    assert summary["member-0"]["batches"] == summary["member-1"]["batches"] == 19
    assert summary["ensemble"]["train_seconds"] == pytest.approx(model.train_seconds_, abs=1e-3)
    assert "member 1 (vanilla LSH sampler)" in out and "ensemble (model.slide)" in out
    assert os.path.exists(os.path.join(run, "time_to_accuracy.png"))


def test_the_run_trains_what_the_python_api_trains(ensemble_run):
    cfg, run, _ = ensemble_run
    resolved = config_mod.load_config(os.path.join(run, "config.toml"))
    d = resolved["data"]        # the set as generated (the files round its values)
    X, Y, _, _ = generate(d["preset"], d["scale"], d["seed"], **d["overrides"])
    api = SlideEnsemble(slide.SlideClassifier(**config_mod.estimator_kwargs(resolved)),
                        n_models=2, random_state=3).fit(X, Y)
    cli = slide.load(os.path.join(run, "model.slide"))
    Xt, _ = read_xc(os.path.join(run, "data", "test.txt"))
    for a, b in zip(api.members_, cli.members_):
        assert a.random_state == b.random_state
        np.testing.assert_array_equal(a.predict_topk(Xt, k=5), b.predict_topk(Xt, k=5))
    np.testing.assert_array_equal(api.predict_topk(Xt, k=5), cli.predict_topk(Xt, k=5))


def test_evaluate_and_predict_read_the_ensemble(ensemble_run, tmp_path, capsys):
    _, run, _ = ensemble_run
    test = os.path.join(run, "data", "test.txt")
    code, out, err = run_cli(["evaluate", "--model", run, "--data", test, "--json"], capsys)
    assert code == 0, err
    X, Y = read_xc(test)
    assert json.loads(out)["P@1"] == pytest.approx(
        slide.load(os.path.join(run, "model.slide")).score(X, Y))
    code, _, err = run_cli(["predict", "--model", run, "--data", test, "--k", "3", "--out",
                            str(tmp_path / "p.txt")], capsys)
    assert code == 0, err
    lines = open(tmp_path / "p.txt").read().splitlines()
    # each label with the score that ranked it (SlideEnsemble.predict_topk_scored)
    ids, scores = slide.load(os.path.join(run, "model.slide")).predict_topk_scored(X, k=3)
    got = [[pair.split(":") for pair in line.split()] for line in lines]
    assert [[int(i) for i, _ in row] for row in got] == ids.tolist()
    np.testing.assert_allclose([[float(v) for _, v in row] for row in got], scores, rtol=1e-5)
    # --sparse needs one model's serving index: a clear usage error, no traceback
    for cmd in ("evaluate", "predict"):
        code, _, err = run_cli([cmd, "--model", run, "--data", test, "--sparse"], capsys)
        assert code == 2 and "is an ensemble" in err and "member-K" in err


def test_resume_keeps_finished_members_and_trains_the_rest(ensemble_run, tmp_path, capsys):
    cfg, first_run, _ = ensemble_run
    run = str(tmp_path / "run")
    shutil.copytree(first_run, run)
    with open(cfg) as f:
        text = f.read().replace(first_run, run)
    cfg = str(tmp_path / "run.toml")
    with open(cfg, "w") as f:
        f.write(text)
    # as if stopped during member 1: its directory and the ensemble's files not yet written
    shutil.rmtree(os.path.join(run, "member-1"))
    for name in ("model.slide", "metrics.jsonl", "summary.json"):
        os.remove(os.path.join(run, name))
    code, out, err = run_cli(["train", "--config", cfg, "--set", "model.n_models=2"], capsys)
    assert code == 2 and "--resume" in err             # a run is there
    code, out, err = run_cli(["evaluate", "--model", run, "--data",
                              os.path.join(run, "data", "test.txt")], capsys)
    assert code != 0 and "member-0" in err             # no model.slide yet: names a member
    code, out, err = run_cli(["train", "--config", cfg, "--set", "model.n_models=3",
                              "--resume"], capsys)
    assert code != 0 and "model.n_models" in err
    code, out, err = run_cli(["train", "--config", cfg, "--set", "model.n_models=2",
                              "--resume"], capsys)
    assert code == 0, err
    assert "[member 0] resuming from" in out and "[member 1] training 19 batches" in out
    Xt, _ = read_xc(os.path.join(run, "data", "test.txt"))
    np.testing.assert_array_equal(
        slide.load(os.path.join(run, "model.slide")).predict_topk(Xt, k=5),
        slide.load(os.path.join(first_run, "model.slide")).predict_topk(Xt, k=5))


def test_an_ensemble_is_not_sharded(tmp_path, capsys):
    cfg, _ = tiny_config(tmp_path)
    code, _, err = run_cli(["train", "--config", cfg, "--set", "model.n_models=2", "--set",
                            "distributed.shards=2"], capsys)
    assert code == 2 and "model.n_models" in err and "distributed.shards" in err


def test_from_members_checks_what_it_is_given(ensemble_run):
    _, run, _ = ensemble_run
    model = slide.load(os.path.join(run, "model.slide"))
    a, b = model.members_
    Xt, _ = read_xc(os.path.join(run, "data", "test.txt"))
    np.testing.assert_array_equal(SlideEnsemble.from_members([a, b], 3).predict_topk(Xt, k=3),
                                  model.predict_topk(Xt, k=3))
    with pytest.raises(ValueError, match="seeded"):
        SlideEnsemble.from_members([b, a], 3)
    with pytest.raises(ValueError, match="fitted SlideClassifiers"):
        SlideEnsemble.from_members([], 3)
    with pytest.raises(ValueError, match="random_state"):
        SlideEnsemble.from_members([a, b], None)
    other = slide.load(os.path.join(run, "member-1", "model.slide"))
    other.set_params(learning_rate=1.0)
    with pytest.raises(ValueError, match="learning_rate"):
        SlideEnsemble.from_members([a, other], 3)


def test_an_ensemble_of_a_text_run_answers_in_names(tmp_path, capsys):
    from test_cli_text import TRAIN_SET, write_jsonl
    from test_text import corpus
    docs, Y = corpus(300, 0)
    te_docs, te_Y = corpus(60, 1)
    train = write_jsonl(tmp_path / "train.jsonl", docs, Y)
    test = write_jsonl(tmp_path / "test.jsonl", te_docs, te_Y)
    run = str(tmp_path / "run")
    code, out, err = run_cli(["train", "--train", train, "--test", test, "--set",
                              f"output_dir={run}", "--set", "model.n_models=2", "--set",
                              "train.epochs=2"] + TRAIN_SET, capsys)
    assert code == 0, err
    pipe = slide.load(os.path.join(run, "model.slide"))      # the ensemble and its vectorizer
    assert isinstance(pipe, Pipeline) and isinstance(pipe[-1], SlideEnsemble)
    model = pipe[-1]
    steps = slide.text.load_steps(os.path.join(run, "vectorizer.slide"))
    X = steps[0][1].transform(te_docs)
    assert (pipe[:-1].transform(te_docs) != X).nnz == 0
    code, out, err = run_cli(["evaluate", "--model", run, "--data", test, "--json"], capsys)
    assert code == 0, err
    top = model.predict_topk(X, k=1, return_names=True)[:, 0]
    assert json.loads(out)["P@1"] == pytest.approx(np.mean([t in y for t, y in zip(top, te_Y)]))
    pred = tmp_path / "pred.jsonl"
    code, _, err = run_cli(["predict", "--model", run, "--data", test, "--k", "2", "--out",
                            str(pred)], capsys)
    assert code == 0, err
    lines = [json.loads(line) for line in open(pred)]
    assert [r["labels"] for r in lines] == model.predict_topk(X, k=2, return_names=True).tolist()
    # exported, the file alone answers raw text: no vectorizer.slide beside it
    out = tmp_path / "served" / "model.slide"
    out.parent.mkdir()
    code, printed, err = run_cli(["export", "--model", run, "--out", str(out)], capsys)
    assert code == 0, err
    assert "with its vectorizer" in printed and os.listdir(out.parent) == ["model.slide"]
    code, out_json, err = run_cli(["evaluate", "--model", str(out), "--data", test, "--json"],
                                  capsys)
    assert code == 0, err
    p_at_1 = np.mean([t in y for t, y in zip(top, te_Y)])
    assert json.loads(out_json)["P@1"] == pytest.approx(p_at_1)


def test_overwrite_removes_the_members(ensemble_run, tmp_path, capsys):
    cfg, first_run, _ = ensemble_run
    run = str(tmp_path / "run")
    shutil.copytree(first_run, run)
    code, _, err = run_cli(["train", "--config", cfg, "--set", f"output_dir={run}",
                            "--overwrite"], capsys)
    assert code == 0, err
    assert not any(name.startswith("member-") for name in os.listdir(run))
    assert isinstance(slide.load(os.path.join(run, "model.slide")), slide.SlideClassifier)


def test_a_member_stopped_by_ctrl_c_resumes_to_the_uninterrupted_ensemble(tmp_path, capsys):
    # 40 epochs of 19 batches a member: member 1 is still training when its first checkpoint
    # (every 5 batches) appears
    cfg, run = tiny_config(tmp_path, "stopped", epochs=40, eval_every=0)
    ref_cfg, ref_run = tiny_config(tmp_path, "whole", epochs=40, eval_every=0)
    proc = _spawn(cfg, "--set", "model.n_models=2")
    _wait_for_checkpoint(proc, os.path.join(run, "member-1"), timeout=300)   # a cold compile first
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "[member 1] stopped by Ctrl-C" in err, err
    assert not os.path.exists(os.path.join(run, "model.slide"))
    code, out, err = run_cli(["train", "--config", cfg, "--set", "model.n_models=2",
                              "--resume"], capsys)
    assert code == 0, err
    assert "[member 1] resuming from" in out
    assert run_cli(["train", "--config", ref_cfg, "--set", "model.n_models=2"], capsys)[0] == 0
    Xt, _ = read_xc(os.path.join(run, "data", "test.txt"))
    a, b = (slide.load(os.path.join(r, "model.slide")) for r in (run, ref_run))
    np.testing.assert_array_equal(a.predict_topk_scored(Xt, k=5)[1],
                                  b.predict_topk_scored(Xt, k=5)[1])
    np.testing.assert_array_equal(a.predict_topk(Xt, k=5), b.predict_topk(Xt, k=5))
