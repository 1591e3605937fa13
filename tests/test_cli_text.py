"""``slide train / evaluate / predict`` on raw text (JSONL and TSV, slide.cli.textdata) and the
text readers' errors (slide.data.textfile)."""
import json

import numpy as np
import pytest

import slide
from slide.cli import main
from slide.data import DataFormatError
from slide.data.textfile import read_text_file

from test_text import corpus

TRAIN_SET = ["--set", "model.hidden_sizes=32", "--set", "train.threads=1",
             "--set", "train.eval_every_batches=0", "--set", "train.checkpoint_every_batches=10",
             "--set", "text.min_df=1"]


def write_jsonl(path, docs, Y=None):
    with open(path, "w") as f:
        for i, d in enumerate(docs):
            rec = {"text": d} if Y is None else {"text": d, "labels": Y[i]}
            f.write(json.dumps(rec) + "\n")
    return str(path)


def write_tsv(path, docs, Y):
    with open(path, "w") as f:
        for d, y in zip(docs, Y):
            f.write(",".join(y) + "\t" + d + "\n")
    return str(path)


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("textrun")
    docs, Y = corpus(400, 0)
    te_docs, te_Y = corpus(80, 1)
    te_Y[0] = te_Y[0] + ["topic/unseen"]
    train = write_jsonl(tmp / "train.jsonl", docs, Y)
    test = write_jsonl(tmp / "test.jsonl", te_docs, te_Y)
    run = str(tmp / "run")
    code = main(["train", "--train", train, "--test", test, "--set", f"output_dir={run}"]
                + TRAIN_SET)
    assert code == 0
    return tmp, run, te_docs, te_Y


def test_train_saves_the_vectorizer_and_a_model_that_reads_text(text_run):
    tmp, run, te_docs, _ = text_run
    pipe = slide.load(f"{run}/model.slide")
    assert type(pipe).__name__ == "Pipeline"
    assert pipe[-1].classes_.tolist() == sorted({"topic/" + t for t in
                                                 ("audio", "db", "game", "math", "web")})
    # the vectorizer file in the run directory is the pipeline's
    steps = slide.text.load_steps(f"{run}/vectorizer.slide")
    np.testing.assert_array_equal(steps[0][1].transform(te_docs).toarray(),
                                  pipe[0].transform(te_docs).toarray())
    assert "[text]" in open(f"{run}/config.toml").read()
    assert json.load(open(f"{run}/summary.json"))["vectorizer_seconds"] > 0


def test_predict_writes_label_names(text_run, capsys):
    tmp, run, te_docs, _ = text_run
    new = write_jsonl(tmp / "new.jsonl", te_docs[:7])
    out = tmp / "pred.jsonl"
    assert main(["predict", "--model", run, "--data", new, "-k", "2", "--out", str(out),
                 "--chunk-size", "3"]) == 0
    lines = [json.loads(line) for line in open(out)]
    pipe = slide.load(f"{run}/model.slide")
    expect = pipe[-1].predict_topk(pipe[0].transform(te_docs[:7]), k=2, return_names=True)
    assert [r["labels"] for r in lines] == expect.tolist()
    assert all(len(r["scores"]) == 2 for r in lines)


def test_predict_on_an_xc_file_answers_a_named_model_in_names(text_run):
    """Rows already vectorised (an XC file): a model that knows its labels' names still
    answers in names, the same JSON lines as for text."""
    import scipy.sparse as sp
    tmp, run, te_docs, _ = text_run
    pipe = slide.load(f"{run}/model.slide")
    X = pipe[0].transform(te_docs[:5])
    xc = tmp / "new.txt"
    slide.data.write_xc(xc, X, sp.csr_matrix((5, pipe[-1].n_labels_), dtype=np.float32))
    out = tmp / "pred_xc.jsonl"
    assert main(["predict", "--model", run, "--data", str(xc), "-k", "3", "--out",
                 str(out)]) == 0
    lines = [json.loads(line) for line in open(out)]
    expect = pipe[-1].predict_topk(X, k=3, return_names=True)
    assert [r["labels"] for r in lines] == expect.tolist()
    assert all(r["labels"][0].startswith("topic/") for r in lines)


def test_evaluate_takes_the_text_file_and_notes_unseen_names(text_run, capsys):
    tmp, run, te_docs, te_Y = text_run
    capsys.readouterr()
    assert main(["evaluate", "--model", run, "--data", str(tmp / "test.jsonl"), "--json"]) == 0
    cap = capsys.readouterr()
    res = json.loads(cap.out)
    assert "1 labels on 1 lines are not among the 5 labels" in cap.err
    pipe = slide.load(f"{run}/model.slide")
    top = pipe[-1].classes_[pipe.predict(te_docs).indices]      # the top-1 name of each row
    assert res["P@1"] == pytest.approx(np.mean([t in y for t, y in zip(top, te_Y)]))
    # the same file as TSV gives the same figures
    tsv = write_tsv(tmp / "test.tsv", te_docs, te_Y)
    assert main(["evaluate", "--model", run, "--data", tsv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["P@1"] == res["P@1"]


def test_tsv_training_and_resume(tmp_path):
    docs, Y = corpus(300, 4)
    train = write_tsv(tmp_path / "train.tsv", docs, Y)
    run = str(tmp_path / "run")
    args = ["train", "--train", train, "--set", f"output_dir={run}"] + TRAIN_SET
    assert main(args + ["--set", "train.epochs=1"]) == 0
    assert main(args + ["--set", "train.epochs=2", "--resume"]) == 0
    model = slide.load(f"{run}/model.slide")[-1]
    assert model.epoch_ == 2 and model.named_labels_
    # a changed [text] setting changes the features: resume refuses it
    assert main(args + ["--set", "train.epochs=3", "--set", "text.ngram_max=2",
                        "--resume"]) == 4


@pytest.mark.parametrize("line, field", [
    ('{"text": "a b", "labels": ["x"]}\n{"text": 3, "labels": ["x"]}\n', "field 'text'"),
    ('{"text": "a b", "labels": ["x"]}\n{"text": "a", "labels": "x"}\n', "field 'labels'"),
    ('{"text": "a b", "labels": ["x"]}\n{"text": "a", "labels": [true]}\n', "field 'labels'"),
    ('{"text": "a b", "labels": ["x"]}\n{"text": "a"}\n', "field 'labels' is missing"),
    ('{"text": "a b", "labels": ["x"]}\n{"text": "a", \n', "not a JSON object"),
    ('{"text": "a b", "labels": ["x"]}\n["a", "b"]\n', "not a JSON object"),
])
def test_jsonl_reader_names_file_line_and_field(tmp_path, line, field):
    path = tmp_path / "bad.jsonl"
    path.write_text(line)
    with pytest.raises(DataFormatError, match=rf"bad.jsonl, line 2: {field}"):
        read_text_file(path, need_labels=True)


@pytest.mark.parametrize("body, field", [
    ("a,b\tfine text\nno tab here\n", "no tab"),
    ("a,b\tfine text\na,,b\ttext\n", "field 'labels' has an empty name"),
    ("a,b\tfine text\n\ttext without labels\n", "field 'labels' is empty"),
])
def test_tsv_reader_names_file_line_and_field(tmp_path, body, field):
    path = tmp_path / "bad.tsv"
    path.write_text(body)
    with pytest.raises(DataFormatError, match=rf"bad.tsv, line 2: {field}"):
        read_text_file(path, need_labels=True)


def test_blank_lines_are_skipped_and_labels_may_be_absent_for_prediction(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"text": "one"}\n\n{"text": "two", "labels": [3, "x"]}\n')
    texts, labels = read_text_file(path)
    assert texts == ["one", "two"] and labels == [[], [3, "x"]]


def test_train_reports_a_bad_line_with_exit_code_3(tmp_path, capsys):
    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "a b", "labels": ["x"]}\n{"txt": "a", "labels": ["x"]}\n')
    code = main(["train", "--train", str(path), "--set", f"output_dir={tmp_path}/run"])
    err = capsys.readouterr().err
    assert code == 3 and "train.jsonl, line 2: field 'text'" in err


def test_raw_text_refused_for_a_model_without_vectorizer(tmp_path, capsys, tiny):
    Xtr, Ytr, _, _ = tiny
    m = slide.SlideClassifier(hidden_sizes=(16,), epochs=1, n_threads=1).fit(Xtr, Ytr)
    m.save(tmp_path / "m.slide")
    data = write_jsonl(tmp_path / "d.jsonl", ["a b"])
    assert main(["predict", "--model", str(tmp_path / "m.slide"), "--data", data]) == 3
    assert "carries no vectorizer" in capsys.readouterr().err
