"""Run configuration for ``slide train``: schema, defaults, TOML loading, ``--set`` overrides and
validation.

A configuration is a plain nested ``dict`` (tables of scalars), so it can be written back as TOML,
stored in a checkpoint's ``extra`` and compared on ``--resume`` without any conversion layer.
Validation collects *every* problem (unknown keys, wrong types, impossible values, missing files)
and raises one :class:`ConfigError` listing them all, each under its dotted key, before any data
is read: a user fixing a config should see the whole list at once, not one error per attempt.
"""
from __future__ import annotations

import copy
import difflib
import json
import math
import os
import re
import sys

from slide import params
from slide.params import Param


if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib


class ConfigError(ValueError):
    """One or more problems in a run configuration.

    ``problems`` is a list of ``(key, message)`` pairs; ``key`` is the dotted config key (or a
    pseudo-key such as ``--set`` or the config file's name for problems that have no key).
    """

    def __init__(self, problems, source=None):
        self.problems = list(problems)
        self.source = source
        super().__init__(self.format())

    def format(self):
        n = len(self.problems)
        where = f" in {self.source}" if self.source else ""
        head = f"invalid configuration{where} ({n} problem{'s' if n != 1 else ''}):"
        return "\n".join([head] + [f"  {key}: {msg}" for key, msg in self.problems])


# Keys a resumed run may change without being refused: they do not alter what is trained, only
# how long, where results go, how often it is evaluated/checkpointed/logged, and how many threads
# run it (a thread count change only forfeits bit-exactness, which holds with threads = 1 anyway).
RESUME_MUTABLE = frozenset({
    "output_dir",
    "data.eval_points",
    "data.propensity_a",
    "data.propensity_b",
    "train.epochs",
    "train.threads",
    "train.eval_every_batches",
    "train.checkpoint_every_batches",
    "train.keep_checkpoints",
    "train.log_every_seconds",
    "train.baseline",
    "distributed.address",
})


def _build_schema() -> dict:
    """The nested TOML schema (table -> key -> :class:`slide.params.Param`), in the table's
    order."""
    schema: dict = {}
    for p in params.CONFIG_PARAMS:
        node = schema
        *tables, leaf = p.key.split(".")
        for t in tables:
            node = node.setdefault(t, {})
        node[leaf] = p
    return schema


SCHEMA: dict = _build_schema()


def _config_default(p):
    """A key's value when the config does not set it: None for an optional key (the estimator
    applies the same default), else the table's default (tuples as TOML arrays)."""
    if p.optional:
        return None
    return list(p.default) if isinstance(p.default, tuple) else copy.deepcopy(p.default)


# Leave room for everything else: hash tables bigger than this share of physical memory are an
# error (the configuration would thrash or be killed long before training).
TABLE_MEMORY_FRACTION = 0.25


# --------------------------------------------------------------------------------------------
# defaults, loading, overrides

def defaults() -> dict:
    """The default configuration (a fresh deep copy)."""
    def build(node):
        if isinstance(node, Param):
            return _config_default(node)
        return {k: build(v) for k, v in node.items()}
    return build(SCHEMA)


def _all_keys(node=SCHEMA, prefix=""):
    for k, v in node.items():
        dotted = f"{prefix}{k}"
        if isinstance(v, Param):
            yield dotted
        else:
            yield dotted
            yield from _all_keys(v, dotted + ".")


def parse_toml_file(path) -> dict:
    """Read a TOML file; problems become a :class:`ConfigError` naming the file."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError([("--config", f"file not found: {path}")]) from None
    except IsADirectoryError:
        raise ConfigError([("--config", f"is a directory, not a TOML file: {path}")]) from None
    except OSError as e:
        raise ConfigError([("--config", f"cannot read {path}: {e.strerror or e}")]) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([("--config", f"{path} is not valid TOML: {e}")]) from None
    except UnicodeDecodeError as e:
        raise ConfigError([("--config", f"{path} is not UTF-8 text: {e}")]) from None


def parse_value(text: str):
    """Parse the value of ``--set key=value`` as a TOML literal (``3``, ``1e-4``, ``true``,
    ``[128, 64]``, ``"x"``); anything that is not a literal is taken as a plain string, so
    ``--set data.train=data/train.txt`` needs no quotes."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(cfg: dict, assignments) -> list:
    """Apply ``key=value`` strings to ``cfg`` in place. Returns the problems found (malformed
    assignments, a key that goes through a non-table); unknown keys are left for validation."""
    problems = []
    for item in assignments or ():
        if "=" not in item:
            problems.append(("--set", f"expected key=value, got {item!r}"))
            continue
        key, _, text = item.partition("=")
        key = key.strip()
        parts = key.split(".")
        if not key or any(not p for p in parts):
            problems.append(("--set", f"malformed key in {item!r}"))
            continue
        node = cfg
        ok = True
        for i, p in enumerate(parts[:-1]):
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            elif not isinstance(nxt, dict):
                problems.append((".".join(parts[: i + 1]),
                                 f"is a value, not a table, so {key!r} cannot be set"))
                ok = False
                break
            node = nxt
        if ok:
            node[parts[-1]] = parse_value(text.strip())
    return problems


def _merge(base: dict, top: dict) -> dict:
    """Deep merge: tables merge key by key, anything else in ``top`` replaces ``base``."""
    out = copy.deepcopy(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "overrides":
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def load_config(path=None, overrides=(), check_files=True, require_data=True) -> dict:
    """Load ``path`` (TOML), apply ``--set`` overrides, fill in defaults and validate.

    Returns the resolved configuration (defaults filled, data paths made absolute); raises
    :class:`ConfigError` listing every problem found. ``require_data=False``: a configuration
    without a data source is valid (``slide compile`` reads no data).
    """
    user = parse_toml_file(path) if path is not None else {}
    problems = apply_overrides(user, overrides)
    try:
        cfg = validate(user, check_files=check_files, source=path, require_data=require_data)
    except ConfigError as e:
        raise ConfigError(problems + e.problems, source=path) from None
    if problems:
        raise ConfigError(problems, source=path)
    return cfg


# --------------------------------------------------------------------------------------------
# validation

_type_name = params.type_name
_suggest = params.suggest


def _check_value(key: str, spec: Param, value, problems: list):
    """Type and range check of one value (the table's checker); returns the normalised value,
    or None after recording the problem."""
    if value is None:
        return None
    value, problem = params.check_value(spec, value)
    if problem:
        problems.append((key, problem))
        return None
    return value


def _walk(user: dict, schema: dict, out: dict, prefix: str, problems: list):
    for k, v in user.items():
        dotted = f"{prefix}{k}"
        if k not in schema:
            # suggest among siblings first, then among every key (a key in the wrong table)
            sib = difflib.get_close_matches(k, list(schema.keys()), n=1, cutoff=0.6)
            hint = f"; did you mean {prefix + sib[0]!r}?" if sib else ""
            if not hint:
                # a key put in the wrong table: same leaf name elsewhere, else a close full key
                leaves = [key for key in _all_keys() if "." in key or key == "output_dir"]
                same = [key for key in leaves if key.rsplit(".", 1)[-1] == k]
                hint = f"; did you mean {same[0]!r}?" if same else _suggest(dotted, leaves)
            problems.append((dotted, f"unknown key{hint}"))
            continue
        spec = schema[k]
        if isinstance(spec, Param) and spec.optional and v == "":
            out[k] = None  # "--set data.preset=" unsets an optional key
            continue
        if isinstance(spec, Param):
            if isinstance(v, dict) and spec.kind != "table":
                what = {"int": "an integer", "float": "a number", "str": "a string",
                        "bool": "true or false", "int_list": "an array of integers",
                        "int_or_auto": "an integer or 'auto'",
                        "int_list_or_auto": "an array of integers or 'auto'"}[spec.kind]
                problems.append((dotted, f"must be {what}, got a table"))
                continue
            value = _check_value(dotted, spec, v, problems)
            if value is not None:
                out[k] = value
        else:
            if not isinstance(v, dict):
                problems.append((dotted, f"must be a table ([{dotted}]), got "
                                         f"{_type_name(v)} ({v!r})"))
                continue
            _walk(v, spec, out[k], dotted + ".", problems)


def validate(user: dict, check_files=True, source=None, require_data=True) -> dict:
    """Validate a user configuration (as parsed from TOML plus overrides) and return the resolved
    configuration with defaults filled in. Raises :class:`ConfigError` with every problem."""
    problems: list = []
    cfg = defaults()
    if not isinstance(user, dict):
        raise ConfigError([("config", "must be a table of keys")], source=source)
    user = dict(user)
    search = user.pop("search", None)
    _walk(user, SCHEMA, cfg, "", problems)
    if search is not None:
        cfg["search"] = _check_search(search, problems, cfg["distributed"]["shards"])
    _check_cross(cfg, problems, check_files=check_files, require_data=require_data)
    if problems:
        raise ConfigError(problems, source=source)
    return cfg


# keys a [search] table may not list: the run's own settings and the ranking stages, fitted once
# for the winner (slide.search.NOT_SEARCHED, by config key)
_NOT_SEARCHED = ("train.seed", "train.threads", "model.neighbours", "model.neighbour_weight",
                 "model.rerank", "train.batches_in_flight")


def _check_search(search, problems: list, shards: int) -> dict:
    """The ``[search]`` table: dotted config keys of the estimator's parameters, each with a
    non-empty array of values checked as the key's own value; ``{}`` after recording problems."""
    if not isinstance(search, dict):
        problems.append(("search", f"must be a table ([search]) of keys and arrays of values, "
                                   f"got {_type_name(search)}"))
        return {}
    if shards:
        problems.append(("search", "trains its trials in one process: not with distributed.shards"))
    out = {}
    for key, values in search.items():
        where = f"search.{key}"
        spec = params.BY_KEY.get(key)
        if spec is None or spec.name is None:
            known = [k for k, p in params.BY_KEY.items() if p.name]
            problems.append((where, f"not a model parameter's config key{_suggest(key, known)}"))
            continue
        if key in _NOT_SEARCHED:
            problems.append((where, "not searched (the run's own setting, or a ranking stage "
                                    "fitted once for the winner)"))
            continue
        if not isinstance(values, list) or not values:
            problems.append((where, f"must be a non-empty array of values, got {values!r}"))
            continue
        checked = [_check_value(f"{where}[{i}]", spec, v, problems) for i, v in enumerate(values)]
        if all(v is not None for v in checked):
            out[key] = checked
    return out


def _header_shape(path):
    """(n_points, n_features, n_labels) from an XC file's first line, or None if unreadable.
    Only the header is read: validation must not read data."""
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            first = f.readline()
    except OSError:
        return None
    parts = first.split()
    if len(parts) != 3 or not all(re.fullmatch(r"\d+", p) for p in parts):
        return None
    return tuple(int(p) for p in parts)


def synthetic_shape(preset, scale, overrides):
    """Parameters of a synthetic set exactly as the generator will use them
    (``slide.synthetic.preset_params``); raises ``ValueError`` for bad overrides."""
    from slide import synthetic
    return synthetic.preset_params(preset, scale, **overrides)


def _physical_memory():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _fmt_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024


def _check_data_source(cfg: dict, problems: list, check_files=True, require_data=True):
    """The data keys: one source, presets and overrides, files and their headers. Returns the
    label count when the header or the preset tells it (else None)."""
    data = cfg["data"]
    n_labels = None

    # --- data source: files or a synthetic preset, not both
    if data["preset"] is not None and data["train"] is not None:
        problems.append(("data", "set either data.train (files) or data.preset (synthetic), "
                                 "not both"))
    elif data["preset"] is None and data["train"] is None and require_data:
        problems.append(("data", "no data: set data.train (and data.test) to XC files, or "
                                 "data.preset to a synthetic preset (slide train --train "
                                 "path/train.txt --test path/test.txt, or --set "
                                 "data.preset=tiny)"))
    if data["preset"] is not None:
        from slide import synthetic
        presets = synthetic.PRESETS
        if data["preset"] not in presets:
            problems.append(("data.preset", f"unknown preset {data['preset']!r}"
                                            f"{_suggest(data['preset'], presets)} "
                                            f"(available: {', '.join(sorted(presets))})"))
        else:
            known = set(presets[data["preset"]])
            bad = False
            for k, v in data["overrides"].items():
                if k not in known:
                    problems.append((f"data.overrides.{k}",
                                     f"unknown generator parameter{_suggest(k, known)}"))
                    bad = True
                elif isinstance(v, bool) or not isinstance(v, (int, float)):
                    problems.append((f"data.overrides.{k}", f"must be a number, got {v!r}"))
                    bad = True
            if not bad:
                try:
                    shape = synthetic_shape(data["preset"], data["scale"], data["overrides"])
                    n_labels = int(shape["n_labels"])
                except ValueError as e:
                    problems.append(("data.overrides", f"{e}"))
    elif data["overrides"]:
        problems.append(("data.overrides", "only applies to a synthetic set (data.preset)"))

    if data["format"] is None:
        # from data.train's extension (.jsonl / .tsv are raw text: slide.data.textfile)
        from slide.data.textfile import format_of
        data["format"] = format_of(data["train"]) if data["train"] is not None else "xc"
    for key in ("train", "test"):
        path = data[key]
        if path is None:
            continue
        path = os.path.abspath(os.path.expanduser(path))
        data[key] = path
        if not check_files:
            continue
        if not os.path.exists(path):
            problems.append((f"data.{key}", f"file not found: {path} "
                                            f"(set the path with --set data.{key}=PATH)"))
        elif not os.path.isfile(path):
            problems.append((f"data.{key}", f"not a regular file: {path}"))
        elif not os.access(path, os.R_OK):
            problems.append((f"data.{key}", f"file not readable: {path}"))
        elif data["format"] == "xc":
            shape = _header_shape(path)
            if shape is None:
                problems.append((f"data.{key}", f"{path}: line 1 is not an XC header "
                                                "'n_points n_features n_labels'"))
            elif key == "train":
                n_labels = shape[2]
    if data["test"] is not None and data["train"] is None and data["preset"] is not None:
        problems.append(("data.test", "a synthetic set brings its own test split; "
                                      "remove data.test or use data.train"))
    cfg["output_dir"] = os.path.abspath(os.path.expanduser(cfg["output_dir"]))
    return n_labels


def _check_cross(cfg: dict, problems: list, check_files=True, require_data=True):
    """Checks that involve several keys, the file system or other modules."""
    lsh, sampler = cfg["lsh"], cfg["sampler"]
    n_labels = _check_data_source(cfg, problems, check_files=check_files,
                                  require_data=require_data)

    # --- hash configuration: the engine's own rule, so the CLI never disagrees with it
    try:
        from slide.kernels.lsh.hashes import check_hash_config
    except ImportError:  # the LSH module is missing: the engine cannot run either
        check_hash_config = None
    hash_keys = {"lsh.family", "lsh.K", "lsh.L", "lsh.range_pow"}
    if check_hash_config is not None and not any(p[0] in hash_keys for p in problems):
        try:
            check_hash_config(lsh["family"], lsh["K"], lsh["L"], lsh["range_pow"])
        except ValueError as e:
            problems.append(("lsh.K", str(e)))

    # --- memory of the tables: offsets int32[L, 2**range_pow + 1] (+ items int32[L, labels])
    if sampler["kind"] != "dense":
        table_bytes = (2 ** lsh["range_pow"] + 1) * lsh["L"] * 4
        if n_labels is not None:
            table_bytes += lsh["L"] * n_labels * 4
        phys = _physical_memory()
        limit = int(phys * TABLE_MEMORY_FRACTION) if phys else 8 << 30
        if table_bytes > limit:
            problems.append(("lsh.range_pow", f"hash tables need {_fmt_bytes(table_bytes)} "
                                              f"(2**{lsh['range_pow']} buckets x {lsh['L']} "
                                              f"tables x 4 bytes), more than "
                                              f"{_fmt_bytes(limit)} ({TABLE_MEMORY_FRACTION:.0%} "
                                              f"of this machine's memory); lower lsh.range_pow "
                                              f"or lsh.L"))

    # --- sampler settings against the label count (known from the header or the preset)
    if n_labels is not None:
        if sampler["budget"] is not None and sampler["budget"] > n_labels:
            problems.append(("sampler.budget", f"{sampler['budget']} exceeds the number of "
                                               f"labels ({n_labels})"))
        if sampler["min_active"] is not None and sampler["min_active"] > n_labels:
            problems.append(("sampler.min_active", f"{sampler['min_active']} exceeds the number "
                                                   f"of labels ({n_labels})"))
    if sampler["threshold"] is not None and sampler["threshold"] > lsh["L"]:
        problems.append(("sampler.threshold", f"{sampler['threshold']} exceeds lsh.L = "
                                              f"{lsh['L']} (a neuron appears in at most L "
                                              f"tables)"))
    if cfg["model"]["n_models"] > 1 and cfg["distributed"]["shards"]:
        problems.append(("model.n_models", "an ensemble trains here: not with distributed.shards"))
    cfg["_n_labels_hint"] = n_labels


def strip_private(cfg: dict) -> dict:
    """The configuration without internal ``_`` keys (what is written and compared)."""
    return {k: (strip_private(v) if isinstance(v, dict) and k != "overrides" else v)
            for k, v in cfg.items() if not k.startswith("_")}


def flatten(cfg: dict, prefix="") -> dict:
    """``{"lsh": {"K": 6}}`` -> ``{"lsh.K": 6}`` (``data.overrides`` stays one value)."""
    out = {}
    for k, v in cfg.items():
        if k.startswith("_"):
            continue
        if isinstance(v, dict) and k != "overrides":
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def resume_differences(saved: dict, current: dict) -> list:
    """Keys whose values differ between a checkpoint's config and the current one, ignoring
    :data:`RESUME_MUTABLE`. Returns ``[(key, saved_value, current_value), ...]``."""
    a, b = flatten(saved), flatten(current)
    # a key the saved configuration lacks was added to slide after that run was written:
    # the run had its default (the [text] keys of an XC run)
    a.update({k: _config_default(params.BY_KEY[k]) for k in set(b) - set(a)
              if k in params.BY_KEY})
    diffs = []
    for key in sorted(set(a) | set(b)):
        if key in RESUME_MUTABLE:
            continue
        if a.get(key) != b.get(key):
            diffs.append((key, a.get(key), b.get(key)))
    return diffs


def estimator_kwargs(cfg: dict, sampler_kind=None) -> dict:
    """Keyword arguments of ``SlideClassifier`` for this configuration, from the table's
    key -> keyword pairs. Unset optional keys are left out so the estimator's defaults (the
    same table's) apply; ``train.threads`` 0 becomes ``n_threads=None`` (all cores) and
    ``train.seed`` becomes ``random_state``."""
    flat = flatten(cfg)
    kw = {p.name: flat[p.key] for p in params.CONFIG_PARAMS if p.name is not None}
    kw["hidden_sizes"] = params.hidden_sizes_value(kw["hidden_sizes"])
    kw["sampler"] = sampler_kind or kw["sampler"]
    threads = cfg["train"]["threads"]
    kw.update(n_threads=threads if threads > 0 else None, random_state=cfg["train"]["seed"])
    return {k: v for k, v in kw.items() if v is not None}


# --------------------------------------------------------------------------------------------
# writing TOML (tomli-w is not a dependency; the config only holds scalars, arrays and tables)

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_key(k):
    return k if _BARE_KEY.match(k) else json.dumps(k, ensure_ascii=False)


def _toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        r = repr(v)
        return r if any(c in r for c in ".en") else r + ".0"
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def to_toml(cfg: dict) -> str:
    """Write a configuration as TOML; keys that are ``None`` (engine default) become comments."""
    lines = []

    def emit_table(table, name):
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict) or k == "overrides"}
        subs = {k: v for k, v in table.items() if isinstance(v, dict) and k != "overrides"}
        if name is not None:
            lines.append("")
            lines.append(f"[{name}]")
        for k, v in scalars.items():
            if k.startswith("_"):
                continue
            if v is None:
                lines.append(f"# {_toml_key(k)} = (not set)")
            else:
                lines.append(f"{_toml_key(k)} = {_toml_value(v)}")
        for k, v in subs.items():
            if k.startswith("_"):
                continue
            emit_table(v, _toml_key(k) if name is None else f"{name}.{_toml_key(k)}")

    emit_table(cfg, None)
    return "\n".join(lines).lstrip("\n") + "\n"


def describe_keys() -> str:
    """A plain-text list of every key with its default and meaning (``slide train --help``)."""
    out = []

    def walk(node, prefix):
        for k, v in node.items():
            dotted = f"{prefix}{k}"
            if isinstance(v, Param):
                if v.default is not None:
                    default = _toml_value(v.default)
                else:
                    default = "(not set)" if dotted.startswith("data.") else "(engine)"
                choices = f" [{' | '.join(v.choices)}]" if v.choices else ""
                out.append(f"  {dotted:34s} {default:12s} {v.doc}{choices}")
            else:
                walk(v, dotted + ".")
    walk(SCHEMA, "")
    return "\n".join(out)
