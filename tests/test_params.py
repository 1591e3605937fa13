"""slide.params, the one table: the API, the configs, the CLI and the docs agree with it."""
import glob
import inspect
import os

import numpy as np
import pytest

from slide import config as C
from slide import params as P
from slide.estimator import SlideClassifier

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_estimator_signature_defaults_are_the_table_defaults():
    sig = inspect.signature(SlideClassifier.__init__)
    api = {k: v.default for k, v in sig.parameters.items() if k != "self"}
    assert api == P.estimator_defaults()


def test_config_defaults_are_the_table_defaults():
    flat = C.flatten(C.defaults())
    assert set(flat) == {p.key for p in P.CONFIG_PARAMS}
    for p in P.CONFIG_PARAMS:
        want = None if p.optional else (list(p.default) if isinstance(p.default, tuple)
                                         else p.default)
        assert flat[p.key] == want, p.key


def test_cli_defaults_train_what_the_api_defaults_train():
    # an empty run configuration gives SlideClassifier exactly its own defaults, except the two
    # keys the CLI spells differently (train.seed 0 -> random_state 0, reproducible runs)
    kw = C.estimator_kwargs(C.load_config(None, ["data.preset=tiny"], check_files=False))
    cli = SlideClassifier(**kw).get_params()
    api = SlideClassifier().get_params()
    differ = {k for k in api if cli[k] != api[k]}
    assert differ == {"random_state"} and cli["random_state"] == 0
    assert cli["batch_size"] == 128


def test_help_lists_every_key_with_its_table_default():
    text = C.describe_keys()
    for p in P.CONFIG_PARAMS:
        line = next(l for l in text.splitlines() if l.split()[0] == p.key)
        if p.default is not None:
            assert C._toml_value(list(p.default) if isinstance(p.default, tuple)
                                 else p.default) in line, p.key


def test_docs_parameters_md_is_generated_from_the_table():
    with open(os.path.join(ROOT, "docs", "parameters.md"), encoding="utf-8") as f:
        assert f.read() == P.markdown(), \
            "docs/parameters.md is stale: python -m slide.params > docs/parameters.md"
    with open(os.path.join(ROOT, "docs", "cli.md"), encoding="utf-8") as f:
        assert "(parameters.md)" in f.read()


def test_sampler_budget_and_shared_negatives_are_documented_as_what_they_are():
    assert "cap on the LSH candidates" in P.BY_NAME["sampler_budget"].doc
    assert "drawn by label frequency" in P.BY_NAME["shared_negatives"].doc


def test_choices_are_the_engines_own():
    from slide.kernels.lsh.hashes import FAMILIES
    from slide.kernels.lsh.index import POLICIES
    from slide.kernels.lsh.samplers import SAMPLERS
    from slide.network import LOSSES
    from slide.network.optim import OPTIMIZERS
    assert set(P.HASH_FAMILIES) == set(FAMILIES)
    assert set(P.BUCKET_POLICIES) == set(POLICIES)
    assert set(P.LSH_SAMPLERS) == set(SAMPLERS)
    assert set(P.LOSSES) == set(LOSSES)
    assert set(P.OPTIMIZERS) == set(OPTIMIZERS)


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "configs", "*.toml"))))
def test_shipped_configs_use_only_table_keys_within_bounds(path):
    user = C.flatten(C.parse_toml_file(path))
    assert user
    for key, value in user.items():
        assert key in P.BY_KEY, f"{path}: {key} is not in slide.params"
        _, problem = P.check_value(P.BY_KEY[key], value)
        assert problem is None, f"{path}: {key} {problem}"


def test_one_checker_for_integers_and_reals():
    assert P.is_int(3) and P.is_int(np.int64(3))
    assert not P.is_int(True) and not P.is_int(3.0) and not P.is_int(np.bool_(True))
    assert P.is_real(1e-4) and P.is_real(np.float32(2)) and P.is_real(2)
    assert not P.is_real(float("nan")) and not P.is_real(float("inf")) and not P.is_real(False)
    assert not P.is_real("1")
    # the same messages from the API and the config
    with pytest.raises(ValueError, match=r"batch_size must be >= 1, got 0"):
        P.check_estimator_params(dict(P.estimator_defaults(), batch_size=0))
    with pytest.raises(C.ConfigError) as e:
        C.load_config(None, ["data.preset=tiny", "train.batch_size=0"], check_files=False)
    assert dict(e.value.problems)["train.batch_size"] == "must be >= 1, got 0"
    with pytest.raises(ValueError, match=r"beta2 must be < 1, got 1.0"):
        P.check_estimator_params(dict(P.estimator_defaults(), beta2=1.0))
    # a zero decay reached the optimizer's power tables as a ZeroDivisionError before
    for name in ("beta1", "beta2"):
        with pytest.raises(ValueError, match=rf"{name} must be > 0, got 0.0"):
            P.check_estimator_params(dict(P.estimator_defaults(), **{name: 0.0}))
    with pytest.raises(ValueError, match=r"sampler must be one of .*did you mean 'topk'"):
        P.check_estimator_params(dict(P.estimator_defaults(), sampler="topK"))
