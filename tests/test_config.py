"""Run configuration: defaults, TOML loading, --set overrides, validation, TOML writing."""
import sys

import pytest

from slide import config as C
from slide.config import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


def write(tmp_path, text, name="run.toml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def xc_file(tmp_path, n_labels=50, name="train.txt"):
    p = tmp_path / name
    p.write_text(f"2 10 {n_labels}\n0,1 0:1.0 3:0.5\n2 1:1.0\n")
    return str(p)


def problems(exc):
    return dict(exc.value.problems)


def test_defaults_with_preset_resolve(tmp_path):
    cfg = C.load_config(None, ["data.preset=tiny", f"output_dir={tmp_path / 'r'}"])
    assert cfg["lsh"]["family"] == "dwta" and cfg["lsh"]["K"] == 6
    assert cfg["train"]["batch_size"] == 128   # the API's default (slide.params)
    assert cfg["output_dir"] == str(tmp_path / "r")
    # the tiny preset's label count is known before any data exists
    assert cfg["_n_labels_hint"] == 200


@pytest.mark.parametrize("text,expected", [
    ("3", 3), ("1e-4", 1e-4), ("true", True), ("[128, 64]", [128, 64]),
    ('"x y"', "x y"), ("data/train.txt", "data/train.txt"), ("runs/x", "runs/x"),
    ("inf", float("inf")),
])
def test_parse_value_is_toml_literal_else_string(text, expected):
    assert C.parse_value(text) == expected


def test_set_overrides_file_values_and_nested_keys(tmp_path):
    train = xc_file(tmp_path)
    path = write(tmp_path, f'output_dir = "a"\n[data]\ntrain = "{train}"\n[lsh]\nK = 4\n')
    cfg = C.load_config(path, ["lsh.K=5", "model.hidden_sizes=[64, 32]",
                               f"output_dir={tmp_path / 'runs' / 'x'}",
                               "optimizer.learning_rate=3e-3", "train.baseline=dense"])
    assert cfg["lsh"]["K"] == 5
    assert cfg["model"]["hidden_sizes"] == [64, 32]
    assert cfg["output_dir"] == str(tmp_path / "runs" / "x")
    assert cfg["optimizer"]["learning_rate"] == pytest.approx(3e-3)
    assert cfg["train"]["baseline"] == "dense"
    assert cfg["data"]["train"] == train  # made absolute (it already was)


def test_single_int_hidden_size_means_one_layer():
    cfg = C.load_config(None, ["data.preset=tiny", "model.hidden_sizes=64"])
    assert cfg["model"]["hidden_sizes"] == [64]


def test_every_problem_is_reported_together_with_its_key(tmp_path):
    train = xc_file(tmp_path, n_labels=50)
    path = write(tmp_path, f"""
output_dir = "runs/x"
[data]
train = "{train}"
test = "{tmp_path / 'missing.txt'}"
[lsh]
family = "dwta"
K = 8
range_pow = 18
bucket_size = 0
[sampler]
budget = 500
[train]
batch_sise = 64
epochs = "two"
threads = -1
[optimiser]
name = "adam"
""")
    with pytest.raises(ConfigError) as e:
        C.load_config(path, ["lsh.L=2.5", "model.hidden_sizes=[128, 0]", "garbage"])
    p = problems(e)
    # unknown keys with the close match suggested
    assert "did you mean 'train.batch_size'" in p["train.batch_sise"]
    assert "did you mean 'optimizer'" in p["optimiser"]
    # wrong types
    assert "integer" in p["train.epochs"] and "'two'" in p["train.epochs"]
    assert "integer" in p["lsh.L"]
    # impossible values
    assert ">= 1" in p["lsh.bucket_size"]
    assert ">= 0" in p["train.threads"]
    assert "hidden_sizes" in " ".join(p) and ">= 1" in p["model.hidden_sizes"]
    assert "exceeds the number of labels (50)" in p["sampler.budget"]  # from the file header
    assert "file not found" in p["data.test"] and "--set data.test=" in p["data.test"]
    assert "key=value" in p["--set"]
    # ... and all of them in one message, each line naming its key
    msg = str(e.value)
    assert f"({len(e.value.problems)} problems)" in msg
    for key in p:
        assert f"  {key}: " in msg


def test_hash_bits_exceeding_range_pow_is_reported():
    with pytest.raises(ConfigError) as e:
        C.load_config(None, ["data.preset=tiny", "lsh.family=dwta", "lsh.K=8",
                             "lsh.range_pow=18"])
    p = problems(e)
    assert "lsh.K" in p and "18" in p["lsh.K"]
    # the same K fits with SimHash (1 bit per function)
    C.load_config(None, ["data.preset=tiny", "lsh.family=simhash", "lsh.K=8",
                         "lsh.range_pow=18"])


def test_range_pow_too_large_for_memory():
    with pytest.raises(ConfigError) as e:
        C.load_config(None, ["data.preset=tiny", "lsh.family=simhash", "lsh.K=9",
                             "lsh.range_pow=30", "lsh.L=64"])
    p = problems(e)
    assert "GiB" in p["lsh.range_pow"] and "lower lsh.range_pow" in p["lsh.range_pow"]


def test_budget_above_preset_labels_and_bad_overrides():
    with pytest.raises(ConfigError) as e:
        C.load_config(None, ["data.preset=tiny", "sampler.budget=201"])
    assert "exceeds the number of labels (200)" in problems(e)["sampler.budget"]
    # overrides change the label count the check uses
    with pytest.raises(ConfigError) as e:
        C.load_config(None, ["data.preset=tiny", "data.overrides.n_labels=100",
                             "sampler.budget=150"])
    assert "(100)" in problems(e)["sampler.budget"]
    with pytest.raises(ConfigError) as e:
        C.load_config(None, ["data.preset=tiyn", "data.overrides.n_trian=5"])
    assert "did you mean 'tiny'" in problems(e)["data.preset"]


def test_unknown_generator_parameter_and_bad_value():
    with pytest.raises(ConfigError) as e:
        C.load_config(None, ["data.preset=tiny", "data.overrides.n_trian=5"])
    assert "did you mean 'n_train'" in problems(e)["data.overrides.n_trian"]
    with pytest.raises(ConfigError) as e:
        C.load_config(None, ["data.preset=tiny", "data.overrides.n_train=-3"])
    assert "n_train" in problems(e)["data.overrides"]


def test_data_source_must_be_exactly_one(tmp_path):
    with pytest.raises(ConfigError) as e:
        C.load_config(None, [])
    assert "no data" in problems(e)["data"]
    train = xc_file(tmp_path)
    with pytest.raises(ConfigError) as e:
        C.load_config(None, ["data.preset=tiny", f"data.train={train}"])
    assert "not both" in problems(e)["data"]


def test_bad_header_is_a_config_problem(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_text("not a header\n")
    with pytest.raises(ConfigError) as e:
        C.load_config(None, [f"data.train={p}"])
    assert "line 1" in problems(e)["data.train"]


def test_key_in_wrong_table_and_table_given_as_value():
    with pytest.raises(ConfigError) as e:
        C.load_config(None, ["data.preset=tiny", "train.K=3", "lsh=5"])
    p = problems(e)
    assert "did you mean 'lsh.K'" in p["train.K"]
    assert "must be a table" in p["lsh"]
    with pytest.raises(ConfigError) as e:
        C.load_config(None, ["data.preset=tiny", "lsh.K.x=1"])
    assert "must be an integer, got a table" in problems(e)["lsh.K"]


def test_choices_are_checked_with_suggestion():
    with pytest.raises(ConfigError) as e:
        C.load_config(None, ["data.preset=tiny", "lsh.family=simhsh", "sampler.kind=topK"])
    p = problems(e)
    assert "did you mean 'simhash'" in p["lsh.family"]
    assert "did you mean 'topk'" in p["sampler.kind"]


def test_invalid_toml_and_missing_config_file(tmp_path):
    bad = write(tmp_path, "[lsh\nK = 3\n")
    with pytest.raises(ConfigError) as e:
        C.load_config(bad)
    assert "not valid TOML" in str(e.value) and bad in str(e.value)
    with pytest.raises(ConfigError) as e:
        C.load_config(str(tmp_path / "nope.toml"))
    assert "file not found" in str(e.value)


def test_toml_writer_round_trips_resolved_config(tmp_path):
    cfg = C.load_config(None, ["data.preset=tiny", "data.overrides.n_train=300",
                               "optimizer.learning_rate=1e-5", 'output_dir=runs/a "b"'])
    clean = C.strip_private(cfg)
    text = C.to_toml(clean)
    back = tomllib.loads(text)
    # None (unset) keys are written as comments and come back absent
    assert "budget" not in back["sampler"] and "# budget = (not set)" in text
    assert C.flatten(back) == {k: v for k, v in C.flatten(clean).items() if v is not None}
    assert back["optimizer"]["learning_rate"] == 1e-5
    assert back["data"]["overrides"] == {"n_train": 300}
    # reading the written file back through load_config gives the same configuration
    p = write(tmp_path, text, "resolved.toml")
    assert C.strip_private(C.load_config(p)) == clean


def test_resume_differences_ignore_operational_keys():
    a = C.strip_private(C.load_config(None, ["data.preset=tiny"]))
    b = C.strip_private(C.load_config(None, ["data.preset=tiny", "train.epochs=5",
                                             "output_dir=elsewhere", "train.threads=1",
                                             "train.eval_every_batches=7"]))
    assert C.resume_differences(a, b) == []
    c = C.strip_private(C.load_config(None, ["data.preset=tiny", "lsh.L=20",
                                             "optimizer.learning_rate=0.02"]))
    keys = [k for k, _, _ in C.resume_differences(a, c)]
    assert keys == ["lsh.L", "optimizer.learning_rate"]


def test_estimator_kwargs_leave_unset_keys_to_the_engine():
    cfg = C.load_config(None, ["data.preset=tiny", "sampler.budget=50", "train.threads=0"])
    kw = C.estimator_kwargs(cfg)
    assert kw["sampler_budget"] == 50 and "sampler_threshold" not in kw
    assert "shared_negatives" not in kw and "sampling_correction" not in kw
    kw2 = C.estimator_kwargs(C.load_config(None, ["data.preset=tiny",
                                                  "sampler.shared_negatives=64",
                                                  "sampler.sampling_correction=false"]))
    assert kw2["shared_negatives"] == 64 and kw2["sampling_correction"] is False
    assert "n_threads" not in kw  # 0 = all cores = the engine's default
    assert C.estimator_kwargs(cfg, sampler_kind="dense")["sampler"] == "dense"
    assert kw["hash_family"] == "dwta" and kw["random_state"] == 0


def test_shipped_configs_validate_apart_from_data_paths():
    import os
    root = os.path.join(os.path.dirname(__file__), "..", "configs")
    for name in ("amazon670k.toml", "delicious200k.toml", "quickstart.toml"):
        cfg = C.load_config(os.path.join(root, name), check_files=False)
        assert cfg["model"]["hidden_sizes"]
    amz = C.load_config(os.path.join(root, "amazon670k.toml"), check_files=False)
    assert (amz["lsh"]["family"], amz["lsh"]["K"], amz["lsh"]["L"], amz["lsh"]["range_pow"],
            amz["lsh"]["bucket_size"], amz["train"]["batch_size"],
            amz["model"]["hidden_sizes"]) == ("dwta", 6, 50, 18, 128, 256, [128])
    dl = C.load_config(os.path.join(root, "delicious200k.toml"), check_files=False)
    assert (dl["lsh"]["family"], dl["lsh"]["K"], dl["lsh"]["L"],
            dl["train"]["batch_size"]) == ("simhash", 9, 50, 128)
    # the data files of the real sets are not shipped: without them validation says so
    with pytest.raises(ConfigError) as e:
        C.load_config(os.path.join(root, "amazon670k.toml"),
                      ["data.train=/nonexistent/train.txt"])
    assert "file not found" in dict(e.value.problems)["data.train"]
