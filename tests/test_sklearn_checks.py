"""scikit-learn's estimator checks over ``SlideClassifier``: every check that applies to a
multi-label top-k model runs; the ones that do not are skipped with the reason below."""
import numpy as np
import pytest

import slide
from slide.params import ESTIMATOR_PARAMS

estimator_checks = pytest.importorskip("sklearn.utils.estimator_checks")
if not hasattr(estimator_checks, "estimator_checks_generator"):   # scikit-learn < 1.6
    pytest.skip("scikit-learn >= 1.6 runs its checks by name", allow_module_level=True)

SKIPS = {
    "check_dtype_object": "an object array is refused, not converted: text reaches slide "
                          "through a vectorizer (docs/text.md), numbers as a numeric array",
    "check_supervised_y_2d": "a 2-D Y is slide's 0/1 label-indicator matrix (multi-label), "
                             "never a column vector of class labels",
    "check_classifiers_multilabel_representation_invariance":
        "a Python list is read as label lists (ids or names: slide.labels), never as the rows "
        "of a dense 0/1 matrix (the XC convention slide keeps)",
    "check_classifiers_multilabel_output_format_predict":
        "predict's indicator matrix is a scipy.sparse CSR (int8), not a dense ndarray: a "
        "dense (n_samples, n_labels) matrix does not fit at extreme label counts "
        "(tests/test_predict.py checks it against scikit-learn's metrics)",
}


def _small():
    return slide.SlideClassifier(hidden_sizes=(16,), epochs=2, batch_size=32, n_threads=1,
                                 random_state=0)


def _checks():
    for est, check in estimator_checks.estimator_checks_generator(
            _small(), legacy=True, expected_failed_checks=SKIPS, mark="skip"):
        name = getattr(check, "func", check).__name__
        yield pytest.param(est, check, id=name)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("estimator, check", list(_checks()))
def test_sklearn_estimator_check(estimator, check):
    check(estimator)


def test_parameter_constraints_come_from_the_table():
    c = slide.SlideClassifier._parameter_constraints
    assert set(c) == {p.name for p in ESTIMATOR_PARAMS}
    assert set(c) == set(slide.SlideClassifier().get_params())
    # every default satisfies its own constraints, and scikit-learn's validation refuses a
    # value outside a bound the table sets
    slide.SlideClassifier()._validate_params()
    from sklearn.utils._param_validation import InvalidParameterError
    with pytest.raises(InvalidParameterError, match="beta1"):
        slide.SlideClassifier(beta1=1.0)._validate_params()
    with pytest.raises(InvalidParameterError, match="sampler"):
        slide.SlideClassifier(sampler="nope")._validate_params()
    # the table's own check runs first, with its message
    with pytest.raises(ValueError, match="beta1 must be < 1, got 1.0"):
        slide.SlideClassifier(beta1=1.0).fit(np.eye(3), [[0], [1], [2]])


def test_validation_keeps_scikit_learns_contract():
    # BaseEstimator._validate_params returns None; slide's checker has its own name
    m = slide.SlideClassifier()
    assert m._validate_params() is None
    assert m._checked_params() == ("auto", (1,))
