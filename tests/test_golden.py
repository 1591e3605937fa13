"""The golden fixture: training, predictions and checkpoints are bit-identical to the engine
that wrote tests/data (tests/make_golden.py says how and why)."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden as mg  # noqa: E402

if not os.path.exists(mg.GOLDEN_JSON):
    pytest.skip(f"no golden fixture for code compiled with {mg.WIDTH}-bit vectors "
                f"({os.path.basename(mg.GOLDEN_JSON)}; tests/make_golden.py writes it)",
                allow_module_level=True)
with open(mg.GOLDEN_JSON) as f:
    GOLDEN = json.load(f)


@pytest.fixture(scope="module")
def dataset():
    return mg.data()


def test_fixture_covers_every_case():
    assert sorted(GOLDEN["cases"]) == sorted(mg.CASES)
    assert GOLDEN["shape"] == mg.SHAPE
    assert GOLDEN.get("vector_width", 256) == mg.WIDTH


def test_both_widths_have_a_fixture():
    # the width this machine does not use by default is checked by hand:
    # SLIDE_VECTOR_WIDTH=256 python -m pytest tests/test_golden.py
    for width in (256, 512):
        for path in mg.fixture_paths(width):
            assert os.path.exists(path), path


@pytest.mark.parametrize("name", sorted(mg.CASES))
def test_training_is_bit_identical(name, dataset):
    X, Y, X_test, _ = dataset
    model = mg.train_case(name, X, Y)
    got = mg.fingerprint(model, X_test)
    want = GOLDEN["cases"][name]
    # predictions first: the most readable difference when something moved
    assert got["top5_exact"] == want["top5_exact"]
    assert got["top5_sparse"] == want["top5_sparse"]
    rtol = bits_pinned_or_rtol(name)
    if rtol:
        # compiled for another CPU (or by another Numba), or another OpenBLAS build: the
        # floats round differently, everything but their last bits must still agree
        assert_close(got, want, rtol)
        return
    assert got == want


def bits_pinned_or_rtol(name):
    """0 where case ``name`` must repeat the fixture bit for bit (the same compilation, and
    for a BLAS case the same BLAS builds); else the relative tolerance of its float sums."""
    if name in mg.BLAS_CASES and GOLDEN.get("blas") != mg.blas_builds():
        return mg.BLAS_RTOL
    if GOLDEN.get("codegen") != mg.codegen_build():
        return mg.CODEGEN_RTOL
    return 0.0


def assert_close(got, want, rtol):
    """Every entry of the fingerprint ``got`` equals ``want``'s, but the float digests: their
    sums within ``rtol`` (relative)."""
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        if isinstance(value, dict):
            assert got[key]["sum"] == pytest.approx(value["sum"], rel=rtol), key
        else:
            assert got[key] == value, key


def test_close_comparison_catches_a_moved_sum():
    want = GOLDEN["cases"]["default"]
    moved = dict(want, W=dict(want["W"], sum=want["W"]["sum"] * (1 + 20 * mg.CODEGEN_RTOL)))
    assert_close(want, want, mg.CODEGEN_RTOL)
    with pytest.raises(AssertionError):
        assert_close(moved, want, mg.CODEGEN_RTOL)
    with pytest.raises(AssertionError):
        assert_close(dict(want, t=want["t"] + 1), want, mg.CODEGEN_RTOL)


def test_blas_cases_are_close_under_another_blas_only():
    # the fallback above must not hide a real change: the recorded sums differ between the
    # BLAS cases by far more than BLAS_RTOL (so a case that trained another case's way fails)
    sums = [GOLDEN["cases"][n]["W"]["sum"] for n in mg.BLAS_CASES]
    for i, a in enumerate(sums):
        for b in sums[i + 1:]:
            assert abs(a - b) > 10 * mg.BLAS_RTOL * max(abs(a), abs(b))


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
    resumed, want = mg.resumed_digest(X, Y), GOLDEN["checkpoint"]["resumed_W"]
    rtol = bits_pinned_or_rtol("default")
    if rtol:
        assert resumed["sum"] == pytest.approx(want["sum"], rel=rtol)
    else:
        assert resumed == want
