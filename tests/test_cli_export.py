"""``slide export`` (``slide.cli.export``): a run's model as one file to predict with, without
the optimizer's state, with the vectorizer of a text run; refused where it would replace its
source; a sharded model converted to one process's first."""
import os

import numpy as np
import pytest

import slide
from slide.data import read_xc
from test_cli import run_cli, tiny_config


@pytest.fixture(scope="module")
def xc_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    cfg, run = tiny_config(tmp, epochs=1, eval_every=0)
    from slide.cli import main
    assert main(["train", "--config", cfg]) == 0
    return tmp, run


def test_export_writes_a_smaller_file_that_predicts_as_the_run(xc_run, tmp_path, capsys):
    _, run = xc_run
    out = tmp_path / "serve.slide"
    code, stdout, err = run_cli(["export", "--model", run, "--out", str(out)], capsys)
    assert code == 0, err
    assert "without the optimizer's state" in stdout
    source = os.path.join(run, "model.slide")
    assert os.path.getsize(out) < 0.8 * os.path.getsize(source)
    served, trained = slide.load(out), slide.load(source)
    assert not served.optimizer_.has_state and trained.optimizer_.has_state
    assert served.extra_ == trained.extra_          # the run's configuration goes along
    X, Y = read_xc(os.path.join(run, "data", "test.txt"))
    np.testing.assert_array_equal(served.predict_topk(X, 5), trained.predict_topk(X, 5))
    with pytest.raises(ValueError, match="without its optimizer's state"):
        served.partial_fit(X, Y)
    # slide predict reads the exported file as it reads the run
    preds = []
    for model in (run, str(out)):
        code, stdout, err = run_cli(["predict", "--model", model, "--data",
                                     os.path.join(run, "data", "test.txt"), "--k", "3"], capsys)
        assert code == 0, err
        preds.append(stdout)
    assert preds[0] == preds[1] and preds[0]
    # kept on request: a file as large as the checkpoint, that trains on
    full = tmp_path / "full.slide"
    code, stdout, err = run_cli(["export", "--model", source, "--out", str(full),
                                 "--optimizer-state"], capsys)
    assert code == 0, err
    assert slide.load(full).optimizer_.has_state
    assert os.path.getsize(full) > os.path.getsize(out)


def test_export_refuses_to_replace_its_source_or_write_a_directory(xc_run, tmp_path, capsys):
    _, run = xc_run
    source = os.path.join(run, "model.slide")
    size = os.path.getsize(source)
    code, _, err = run_cli(["export", "--model", run, "--out", source], capsys)
    assert code == 2 and "is the model it reads" in err
    assert os.path.getsize(source) == size and slide.load(source).optimizer_.has_state
    code, _, err = run_cli(["export", "--model", run, "--out", str(tmp_path)], capsys)
    assert code == 2 and "is a directory" in err
    code, _, err = run_cli(["export", "--model", str(tmp_path / "none"), "--out",
                            str(tmp_path / "x.slide")], capsys)
    assert code == 4 and "not found" in err


def test_a_text_run_exports_one_file_with_its_vectorizer(tmp_path, capsys):
    from test_cli_text import TRAIN_SET, write_jsonl
    from test_text import corpus
    docs, Y = corpus(300, 0)
    te_docs, _ = corpus(40, 1)
    train = write_jsonl(tmp_path / "train.jsonl", docs, Y)
    test = write_jsonl(tmp_path / "test.jsonl", te_docs)
    run = str(tmp_path / "run")
    code, _, err = run_cli(["train", "--train", train, "--set", f"output_dir={run}"] + TRAIN_SET,
                           capsys)
    assert code == 0, err
    served_dir = tmp_path / "served"
    served_dir.mkdir()
    out = served_dir / "model.slide"        # alone: no vectorizer.slide beside it
    code, stdout, err = run_cli(["export", "--model", run, "--out", str(out)], capsys)
    assert code == 0, err
    assert "with its vectorizer" in stdout
    pipe = slide.load(out)
    assert type(pipe).__name__ == "Pipeline" and not pipe[-1].optimizer_.has_state
    run_pipe = slide.load(os.path.join(run, "model.slide"))
    assert pipe[-1].predict_topk(pipe[:-1].transform(te_docs), k=2, return_names=True).tolist() \
        == run_pipe[-1].predict_topk(run_pipe[:-1].transform(te_docs), k=2,
                                     return_names=True).tolist()
    preds = []
    for model in (run, str(out)):
        code, stdout, err = run_cli(["predict", "--model", model, "--data", test, "--k", "2"],
                                    capsys)
        assert code == 0, err
        preds.append(stdout)
    assert preds[0] == preds[1] and preds[0]


def test_a_sharded_model_is_converted_first(xc_run, tmp_path, capsys):
    from slide.distributed.convert import from_single
    _, run = xc_run
    single = slide.load(os.path.join(run, "model.slide"))
    sharded_run = tmp_path / "sharded"
    sharded = from_single(single, 2)
    sharded.save(sharded_run / "model.slide")                      # a directory of shards
    with pytest.raises(ValueError, match="to_single"):
        slide.save(sharded, tmp_path / "compact", optimizer_state=False)
    out = tmp_path / "x.slide"
    code, stdout, err = run_cli(["export", "--model", str(sharded_run), "--out", str(out)],
                                capsys)
    assert code == 0, err
    assert "converted from 2 shards" in stdout and "without the optimizer's state" in stdout
    served = slide.load(out)
    assert not hasattr(served, "n_shards") and not served.optimizer_.has_state
    X, _ = read_xc(os.path.join(run, "data", "test.txt"))
    np.testing.assert_array_equal(served.predict_topk(X, 5), sharded.predict_topk(X, 5))
    sharded.close()
