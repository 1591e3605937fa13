"""The golden fixture: training, predictions and checkpoints are bit-identical to the engine
that wrote tests/data (tests/make_golden.py says how and why)."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden as mg  # noqa: E402

with open(mg.GOLDEN_JSON) as f:
    GOLDEN = json.load(f)


@pytest.fixture(scope="module")
def dataset():
    return mg.data()


def test_fixture_covers_every_case():
    assert sorted(GOLDEN["cases"]) == sorted(mg.CASES)
    assert GOLDEN["shape"] == mg.SHAPE


@pytest.mark.parametrize("name", sorted(mg.CASES))
def test_training_is_bit_identical(name, dataset):
    X, Y, X_test, _ = dataset
    model = mg.train_case(name, X, Y)
    got = mg.fingerprint(model, X_test)
    want = GOLDEN["cases"][name]
    # predictions first: the most readable difference when something moved
    assert got["top5_exact"] == want["top5_exact"]
    assert got["top5_sparse"] == want["top5_sparse"]
    assert got == want


def test_golden_checkpoint_loads_and_predicts_the_same(dataset):
    import slide
    _, _, X_test, _ = dataset
    model = slide.load(mg.GOLDEN_CKPT)
    Xq = X_test[:mg.N_ROWS]
    assert model.predict_topk(Xq, k=5, exact=True).tolist() == GOLDEN["checkpoint"]["top5_exact"]
    assert mg.tables_top5(model, Xq).tolist() == GOLDEN["checkpoint"]["top5_sparse"]
    # the loaded model is the default case's trained model
    assert mg.digest(model.network_.W) == GOLDEN["cases"]["default"]["W"]
    assert mg.digest(model.network_.B) == GOLDEN["cases"]["default"]["B"]
    # and it resumes training as it did when the file was written
    X, Y, _, _ = dataset
    assert mg.resumed_digest(X, Y) == GOLDEN["checkpoint"]["resumed_W"]
