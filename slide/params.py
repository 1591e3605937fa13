"""The one table of slide's parameters.

Every hyperparameter of ``SlideClassifier`` and every key of a ``slide train`` run configuration
is one :class:`Param` row below: its estimator keyword, its dotted config key, its type, default,
bounds or choices and one line of documentation. The row drives

- ``SlideClassifier`` validation (``check_estimator_params``),
- the TOML schema of ``slide.config`` and so ``--set`` and ``slide train --help``,
- ``docs/parameters.md`` (``python -m slide.params > docs/parameters.md``; a test checks it is
  up to date),

so a default, a bound or a list of choices exists once. The choices of the engine's named
options are spelled here (importing the engine would load Numba, and the CLI must answer a bad
config at once); a test checks them against the engine's own tables.

Keys with ``optional=True`` may be left unset in a config: the estimator's default (the same
row's ``default``) then applies, and checks against the data (``sampler.budget`` against the
label count) only run for a value the user gave.
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np


HASH_FAMILIES = ("simhash", "wta", "dwta", "doph")           # slide.kernels.lsh.hashes.FAMILIES
BUCKET_POLICIES = ("fifo", "reservoir")                       # slide.kernels.lsh.index.POLICIES
LSH_SAMPLERS = ("vanilla", "topk", "threshold")               # slide.kernels.lsh.samplers.SAMPLERS
SAMPLERS = LSH_SAMPLERS + ("random", "dense")
LOSSES = ("softmax", "sigmoid", "softmax_each")               # slide.network.LOSSES
OPTIMIZERS = ("adam", "lazy_adam", "sgd")                     # slide.network.optim.OPTIMIZERS
BIAS_INITS = ("log_prior", "zero")
LR_SCHEDULES = ("constant", "linear", "cosine")                # slide.network.trainer.LR_SCHEDULES

# kinds: int, float, str, bool, int_list (an int means a list of one), table (a TOML table),
# int_or_none, float_or_none, int_or_auto (an int or the string "auto"), int_list_or_auto (an
# int_list or "auto"), layers (None or a sequence of layer indices; the bound depends on
# hidden_sizes)


@dataclass(frozen=True)
class Param:
    """One parameter: ``name`` is the ``SlideClassifier`` keyword (None: run configuration
    only), ``key`` the dotted config key (None: Python API only)."""

    name: str | None
    key: str | None
    kind: str
    default: Any
    doc: str
    choices: tuple = ()
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    optional: bool = False


def _p(name, key, kind, default, doc, **kw):
    return Param(name, key, kind, default, doc, **kw)


TABLE = (
    _p(None, "output_dir", "str", "runs/run",
       "run directory (config, metrics, checkpoints, model)"),
    _p(None, "data.format", "str", None, "format of data.train / data.test: xc (header "
       "'points features labels'), jsonl ({\"text\": ..., \"labels\": [...]} a line) or tsv "
       "(labels,comma,separated<TAB>text); unset: from data.train's extension (.jsonl, .tsv, "
       "else xc). jsonl and tsv are raw text, vectorised by the [text] settings "
       "(docs/text.md)", choices=("xc", "jsonl", "tsv"), optional=True),
    _p(None, "data.train", "str", None,
       "training file (data.format)", optional=True),
    _p(None, "data.test", "str", None, "test file; the evaluation sample is drawn from it "
       "(from the training file when absent)", optional=True),
    _p(None, "data.preset", "str", None, "synthetic preset (slide.synthetic.PRESETS) used "
       "instead of data files", optional=True),
    _p(None, "data.scale", "float", 1.0, "synthetic: multiplies features, labels and points",
       gt=0),
    _p(None, "data.seed", "int", 0, "synthetic: generator seed", ge=0),
    _p(None, "data.overrides", "table", {}, "synthetic: shape parameters that override the "
       "preset (e.g. n_train, n_labels)"),
    _p(None, "data.eval_points", "int", 2000, "size of the fixed shuffled evaluation sample",
       ge=1),
    _p(None, "data.propensity_a", "float", 0.55, "A of the inverse propensities used by PSP@k "
       "(XC repository: 0.6 for Amazon, 0.55 otherwise)", gt=0),
    _p(None, "data.propensity_b", "float", 1.5, "B of the inverse propensities used by PSP@k "
       "(XC repository: 2.6 for Amazon, 1.5 otherwise)", ge=0),
    _p(None, "data.save_generated", "bool", True, "synthetic: write train.txt/test.txt into "
       "OUTPUT_DIR/data so evaluate/predict can use them"),
    _p(None, "text.vectorizer", "str", "tfidf", "raw-text data: tfidf (TfidfVectorizer, "
       "vocabulary and idf from the training file) or hashing (HashingVectorizer of "
       "text.n_features columns, then TfidfTransformer: no vocabulary kept)",
       choices=("tfidf", "hashing")),
    _p(None, "text.sublinear_tf", "bool", True, "tf = 1 + log(count) (measured best: "
       "docs/text.md)"),
    _p(None, "text.min_df", "int", 2, "tfidf: drop terms in fewer training documents", ge=1),
    _p(None, "text.max_df", "float", 1.0, "tfidf: drop terms in a larger share of the "
       "training documents", gt=0, le=1),
    _p(None, "text.max_features", "int", None, "tfidf: keep the most frequent terms only; "
       "unset: all", ge=1, optional=True),
    _p(None, "text.ngram_max", "int", 1, "word n-grams from 1 to this length", ge=1, le=3),
    _p(None, "text.lowercase", "bool", True, "lowercase before tokenising"),
    _p(None, "text.token_pattern", "str", r"(?u)\b\w+\b",
       "regular expression of a token (words, one-letter ones kept, 'libfoo-dev' split in "
       "two: the best of four patterns measured on debdeps' raw text, docs/text.md)"),
    _p(None, "text.strip_accents", "str", None, "ascii or unicode: strip accents; unset: "
       "keep them", choices=("ascii", "unicode"), optional=True),
    _p(None, "text.n_features", "int", 2**20, "hashing: columns of the hashed features",
       ge=1),
    _p("hidden_sizes", "model.hidden_sizes", "int_list_or_auto", "auto",
       "widths of the hidden ReLU layers (at least one); auto: one layer of 256 where the "
       "model (both layers' weights and Adam's two moments) stays within 1 GiB at that width, "
       "else 128 (slide.network.trainer.resolve_hidden_sizes; docs/design.md, 'Why a hidden "
       "layer of 256')", ge=1),
    _p("loss", "model.loss", "str", "softmax", "loss over the active output neurons: softmax "
       "(target 1/|y| on each label), sigmoid (binary cross-entropy), softmax_each (one "
       "softmax per label over it and the non-labels: the network alone ranks better on rows "
       "with many labels)", choices=LOSSES),
    _p("output_bias_init", "model.output_bias_init", "str", "log_prior",
       "log_prior: output biases start at log((label count + 1) / (points + labels)) of the "
       "training labels; zero: the dense baselines' initialisation", choices=BIAS_INITS),
    _p("hash_family", "lsh.family", "str", "dwta", "LSH family of the sparse layers",
       choices=HASH_FAMILIES),
    _p("K", "lsh.K", "int", 6, "hash functions concatenated per table (K codes must fit in "
       "range_pow bits)", ge=1),
    _p("L", "lsh.L", "int", 50, "hash tables", ge=1),
    _p("range_pow", "lsh.range_pow", "int", 18, "log2 of the buckets per table", ge=1, le=30),
    _p("bucket_size", "lsh.bucket_size", "int", 128, "most neurons kept per bucket", ge=1),
    _p("bucket_policy", "lsh.policy", "str", "fifo", "which neurons a full bucket keeps: fifo "
       "the latest inserted, reservoir a uniform subset", choices=BUCKET_POLICIES),
    _p("sampler", "sampler.kind", "str", "random", "how the output layer picks its active "
       "neurons: random (the true labels plus the frequency-drawn shared negatives, no LSH: "
       "the measured best, bench/results/lsh_study.md), an LSH sampler (vanilla, topk, "
       "threshold: adds each sample's LSH candidates) or dense (full softmax)",
       choices=SAMPLERS),
    _p("sampler_budget", "sampler.budget", "int", 1024, "cap on the LSH candidates taken per "
       "sample, beyond the true labels and shared negatives (not the total active size)", ge=1,
       optional=True),
    _p("sampler_threshold", "sampler.threshold", "int", 2, "threshold sampler: minimum number "
       "of tables a neuron must appear in", ge=1, optional=True),
    _p("min_active", "sampler.min_active", "int", 0, "each sample's active set is padded with "
       "its own random neurons up to this size", ge=0, optional=True),
    _p("shared_negatives", "sampler.shared_negatives", "int", 1024, "negatives drawn by label "
       "frequency once per batch and active for every sample of it", ge=0, optional=True),
    _p("exact_head", "sampler.exact_head", "float", 0.5, "share of shared_negatives given to "
       "the most frequent labels: in every batch's block and computed exactly, the rest drawn "
       "by frequency from the other labels (0: every one drawn; needs negative_power > 0)",
       ge=0, lt=1, optional=True),
    _p("sampling_correction", "sampler.sampling_correction", "bool", True, "add -log P(drawn) "
       "to each shared negative's logit so the sampled softmax estimates the full one",
       optional=True),
    _p("negative_power", "sampler.negative_power", "float", 1.0, "shared negatives are drawn "
       "with probability ~ (training count + 1) ** power (0: uniform)", ge=0, le=2,
       optional=True),
    _p("optimizer", "optimizer.name", "str", "adam", "adam: rows a batch skipped catch up on "
       "dense Adam's momentum at their next touch, each missed step at its own scheduled "
       "rate (dense Adam's trajectory); lazy_adam: untouched rows do not move; sgd",
       choices=OPTIMIZERS),
    _p("learning_rate", "optimizer.learning_rate", "float", 1e-2, "step size (the peak of the "
       "schedule; measured best on real sets, bench/results/accuracy.md; the SLIDE paper used "
       "1e-4 with a constant rate)", gt=0),
    _p("lr_schedule", "optimizer.lr_schedule", "str", "cosine", "learning rate over the "
       "run (epochs x batches per epoch): constant, or decayed linearly / by a half cosine "
       "from learning_rate towards 0 after the warm-up", choices=LR_SCHEDULES),
    _p("warmup_batches", "optimizer.warmup_batches", "int", 0, "batches over which the "
       "learning rate rises linearly from learning_rate / warmup_batches to learning_rate",
       ge=0),
    # > 0: catch-up Adam's closed form for a row's missed steps divides by beta1 / sqrt(beta2)
    _p("beta1", "optimizer.beta1", "float", 0.9, "Adam first-moment decay", gt=0, lt=1),
    _p("beta2", "optimizer.beta2", "float", 0.999, "Adam second-moment decay", gt=0, lt=1),
    _p("epsilon", "optimizer.epsilon", "float", 1e-8, "Adam epsilon", gt=0),
    _p("rehash_period", "schedule.rehash_period", "int", 50, "T_0: batches before the first "
       "rehash of the tables", ge=1),
    _p("rebuild_period", "schedule.rebuild_period", "int", 500, "batches before the first "
       "rebuild with fresh hash functions", ge=1, optional=True),
    _p("rehash_decay", "schedule.rehash_decay", "float", 0.02, "lambda: the t-th period is "
       "T_0 * exp(lambda * t)", ge=0, optional=True),
    _p("epochs", "train.epochs", "int_or_auto", "auto", "passes over the training set (the "
       "learning-rate schedule spans them); auto: the count whose batches come nearest to "
       "2500, at least 3 and at most 8, so more on small training sets (slide.network.trainer."
       "resolve_epochs, measured in bench/results/accuracy.md)", ge=1),
    # batch_size's le: a sample's active-set marks are stamped serial * 2**20 + position + 1
    # (slide.kernels.sample.mark_stamp, MARK_STRIDE): unique only while a batch has fewer
    # than 2**20 samples
    _p("engine", "train.engine", "str", "batched", "how a sampled output layer is computed: "
       "batched (the batch's shared negatives as three BLAS products, the per-sample loops "
       "only for each sample's labels, LSH ids and fill outside them: slide.network.block) or "
       "per_sample (every sample scores its whole active set in its own loops: the reference "
       "path the batched one is tested against; same objective, float32 sums in another "
       "order)", choices=("batched", "per_sample")),
    _p("batch_size", "train.batch_size", "int", 128, "samples per batch (below 2**20: the "
       "per-batch stamps of the active sets)", ge=1, le=2**20 - 1),
    _p("max_row_labels", "train.max_row_labels", "int", 256, "fit trains every stage on at "
       "most this many labels of a row, a random subset drawn once with the seed (a few rows "
       "of thousands of labels weighed on the softmax, the label prior, the vote and the "
       "linear classifiers: bench/results/label_cap_*); 0: every label", ge=0),
    _p("time_budget", None, "float_or_none", None, "training seconds (train_seconds_) after "
       "which fit stops, its learning-rate schedule planned to end there: the decay follows "
       "the clock or the batch count, whichever is further along; epochs stays the cap. "
       "The neighbour memory (model.neighbours) is built and the re-ranker (model.rerank) "
       "fitted after the budget, their seconds counted (~26 s at Amazon-670K's shape). "
       "Not bit-reproducible (the clock decides); None: no budget", gt=0),
    _p("neighbours", "model.neighbours", "int", 20, "exact predictions blend the network's "
       "probabilities with the label vote of the query's nearest training rows in the last "
       "hidden layer (slide.rank.vote; built at the end of fit); 0: the network alone", ge=0,
       optional=True),
    _p("neighbour_weight", "model.neighbour_weight", "float", 0.85, "the vote's share of that "
       "blend: (1 - w) * p_network + w * vote (measured best on real sets, "
       "bench/results/accuracy.md)", ge=0, le=1, optional=True),
    _p("rerank", "model.rerank", "bool", True, "with the neighbour vote: fit holds out 10 % "
       "of the training rows (at most 5,000, fewer at many labels; at least 2,000 rows "
       "needed), trains per-label linear classifiers over the input (one-vs-rest where labels "
       "are few, else against the network's hard negatives: slide.rank.linear) and fits a "
       "logistic re-ranker of the vote's candidates on the held-out rows (slide.rank.rerank); "
       "exact predict_topk ranks by it, predict_proba stays the blend", optional=True),
    _p(None, "model.n_models", "int", 1, "slide train only: 1 trains one SlideClassifier; N >= "
       "2 trains SlideEnsemble(n_models=N)'s members one after another (member k seeded "
       "slide.ensemble.member_seed(train.seed, k), each in its own member-k/ directory, "
       "resumed on its own) and writes the ensemble as model.slide; 2 ranked 0.4-0.5 points "
       "of P@1 above one model on the real sets for twice its time "
       "(bench/results/accuracy_defaults_amd.md)", ge=1),
    _p(None, "train.threads", "int", 0, "worker threads (0 = all cores; the API's n_threads)",
       ge=0),
    _p(None, "train.seed", "int", 0, "seed of weights, hashes, batch order, sampling and the "
       "evaluation sample (the API's random_state)", ge=0),
    _p(None, "train.eval_every_batches", "int", 100, "batches between evaluations (0 = at the "
       "end only)", ge=0),
    _p(None, "train.checkpoint_every_batches", "int", 500, "batches between checkpoints "
       "(0 = at the end only)", ge=0),
    _p(None, "train.keep_checkpoints", "int", 3, "checkpoints kept (older ones are deleted)",
       ge=1),
    _p(None, "train.log_every_seconds", "float", 10.0, "seconds between plain log lines (when "
       "stdout is not a terminal)", gt=0),
    _p(None, "train.baseline", "str", "none", "dense: also train the same network with a full "
       "softmax (sampler dense) and compare", choices=("none", "dense")),
    _p(None, "distributed.shards", "int", 0, "output-layer shards: 0 trains in this process; "
       "N >= 1 splits the output layer by label over N Ray actors (slide.distributed, "
       "docs/distributed.md)", ge=0),
    _p(None, "distributed.address", "str", None, "Ray cluster to join with distributed.shards "
       "(\"auto\" or \"host:port\"); unset: start a local Ray", optional=True),
    _p(None, "distributed.pipeline_depth", "int", 1, "batches in flight between the driver and "
       "the shards: 1 synchronous; d >= 2 one message a batch, d - 1 in flight, the hidden "
       "layer's output up to 2d - 3 batches stale (docs/distributed.md)", ge=1),
    _p("sparse_layers", None, "layers", None, "layers that use LSH (0 = first hidden, "
       "len(hidden_sizes) = output); None: the output layer only; none with sampler dense"),
    _p("n_threads", None, "int_or_none", None, "worker threads; None: all cores (Numba's TBB "
       "threads where the tbb package is installed; on another layer the user did not choose, "
       "fit warns once: a busy core would stall every batch)", ge=1),
    _p("batches_in_flight", "train.batches_in_flight", "int_or_auto", "auto", "batches trained "
       "at the same time by workers that update the shared weights without locks (HOGWILD "
       "across batches: slide.network.inflight), each on n_threads / batches_in_flight "
       "threads; 1: one batch at a time on every thread (bit-reproducible with one thread); "
       "above 1 results vary from run to run. auto: one a thread, at most 4 (2 to 4 in "
       "flight kept one batch at a time's accuracy, 8 lost 1.6 points of P@1: "
       "bench/results/inflight_2core.md; on 16 cores 4 trained 8.0-8.5x one thread, 16 "
       "lost 5 points: bench/results/many_core_16core.md). Above 4, the first quarter of the "
       "batches trains with 4 (slide.network.inflight.WARM_SHARE): 16 in flight then kept "
       "P@1 on a real set of 133k labels and lost about a point at 200k labels "
       "(bench/results/inflight_staleness_2core_88ee465.md). At most the batches of an "
       "epoch (fewer workers then, each batch on a worker's threads); 1 where the compiled "
       "batch does not apply (a sparse first layer, engine per_sample, sampler dense)",
       ge=1),
    _p("random_state", None, "int_or_none", None, "seed; None: a fresh one per fit", ge=0),
    _p("verbose", None, "int", 0, "0 silent, 1 a line per epoch (and the seconds a process's "
       "first warm-up took to compile or load the kernels), 2 also every 100 batches", ge=0),
)

ESTIMATOR_PARAMS = tuple(p for p in TABLE if p.name is not None)
CONFIG_PARAMS = tuple(p for p in TABLE if p.key is not None)
BY_NAME = {p.name: p for p in ESTIMATOR_PARAMS}
BY_KEY = {p.key: p for p in CONFIG_PARAMS}


def estimator_defaults() -> dict:
    """``SlideClassifier``'s keyword defaults."""
    return {p.name: p.default for p in ESTIMATOR_PARAMS}


# --------------------------------------------------------------------------------------------
# the one integer / real checker

def is_int(v) -> bool:
    """A Python or NumPy integer, not a bool."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def hidden_sizes_value(value):
    """A ``hidden_sizes`` value as the estimator holds it: "auto", or a tuple of widths (a
    JSON or TOML array read back)."""
    return value if isinstance(value, str) else tuple(value)


def hidden_layer_count(value):
    """The number of hidden layers a ``hidden_sizes`` value builds ("auto": one)."""
    return 1 if isinstance(value, str) else len(tuple(value))


def check_k(k, n_labels):
    """``k`` of a top-k prediction: a positive integer, at most ``n_labels`` (scikit-learn
    raises rather than return fewer columns than asked for, or pad them). Returns int(k)."""
    if not is_int(k) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if k > n_labels:
        raise ValueError(f"k = {int(k)} is more than the model's n_labels = {int(n_labels)}")
    return int(k)


def is_real(v) -> bool:
    """A finite Python or NumPy number, not a bool."""
    return (isinstance(v, (int, float, np.integer, np.floating))
            and not isinstance(v, (bool, np.bool_)) and math.isfinite(float(v)))


def type_name(value) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "a boolean"
    if is_int(value):
        return "an integer"
    if isinstance(value, (float, np.floating)):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def suggest(word, candidates) -> str:
    """``"; did you mean 'x'?"`` for the closest candidate, or ``""``."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    if not close:
        lowered = {c.lower(): c for c in candidates}
        if word.lower() in lowered:
            close = [lowered[word.lower()]]
    return f"; did you mean {close[0]!r}?" if close else ""


def _bounds_problem(p: Param, v):
    for bound, ok, sign in ((p.gt, lambda b: v > b, ">"), (p.ge, lambda b: v >= b, ">="),
                            (p.le, lambda b: v <= b, "<="), (p.lt, lambda b: v < b, "<")):
        if bound is not None and not ok(bound):
            return f"must be {sign} {bound:g}, got {v!r}"
    return None


def _check_int_list(p: Param, value):
    if is_int(value):
        value = [value]     # "--set model.hidden_sizes=256" / hidden_sizes=256: one layer
    if isinstance(value, (str, bytes, dict)):
        return None, f"must be a non-empty array of integers, got {value!r}"
    try:
        items = list(value)
    except TypeError:
        return None, f"must be a non-empty array of integers, got {value!r}"
    if not items or not all(is_int(v) for v in items):
        return None, f"must be a non-empty array of integers, got {value!r}"
    if p.ge is not None and any(v < p.ge for v in items):
        return None, f"every entry must be >= {p.ge:g}, got {value!r}"
    return [int(v) for v in items], None


def check_value(p: Param, value):
    """``(normalised value, None)`` or ``(None, problem)`` for one value of ``p``; the problem
    reads after the parameter's name ("must be >= 1, got 0")."""
    kind = p.kind
    if kind == "int_list_or_auto":
        if isinstance(value, str):
            if value == "auto":
                return value, None
            return None, f"must be 'auto' or a non-empty array of integers, got {value!r}"
        kind = "int_list"
    if kind == "int_list":
        return _check_int_list(p, value)
    if kind in ("int_or_none", "float_or_none"):
        if value is None:
            return None, None
        kind = kind[:-len("_or_none")]
    if kind == "int_or_auto":
        if isinstance(value, str):
            if value == "auto":
                return value, None
            return None, f"must be an integer or 'auto', got {value!r}"
        if not is_int(value):
            return None, f"must be an integer or 'auto', got {type_name(value)} ({value!r})"
        kind = "int"
    if kind == "int" and not is_int(value):
        return None, f"must be an integer, got {type_name(value)} ({value!r})"
    if kind == "float":
        if not is_real(value):
            if isinstance(value, (bool, np.bool_)) or not isinstance(
                    value, (int, float, np.integer, np.floating)):
                return None, f"must be a number, got {type_name(value)} ({value!r})"
            return None, f"must be finite, got {value!r}"
        value = float(value)
    if kind == "str" and not isinstance(value, str):
        return None, f"must be a string, got {type_name(value)} ({value!r})"
    if kind == "bool":
        if not isinstance(value, (bool, np.bool_)):
            return None, f"must be true or false, got {type_name(value)} ({value!r})"
        value = bool(value)
    if kind == "table":
        if not isinstance(value, dict):
            return None, f"must be a table, got {type_name(value)} ({value!r})"
        return dict(value), None
    if p.choices and value not in p.choices:
        return None, (f"must be one of {', '.join(map(repr, p.choices))}, got {value!r}"
                      f"{suggest(str(value), p.choices)}")
    if kind in ("int", "float"):
        problem = _bounds_problem(p, value)
        if problem:
            return None, problem
        value = int(value) if kind == "int" else value
    return value, None


def check_estimator_params(values: dict) -> dict:
    """Check ``SlideClassifier`` hyperparameters (name -> value) against the table; raise
    ``ValueError`` naming the first offending one. Returns the normalised values (``layers``
    entries are returned unchanged: their bound depends on ``hidden_sizes``)."""
    out = {}
    for p in ESTIMATOR_PARAMS:
        value = values[p.name]
        if p.kind == "layers":
            out[p.name] = value
            continue
        value, problem = check_value(p, value)
        if problem:
            raise ValueError(f"{p.name} {problem}")
        out[p.name] = value
    return out


# --------------------------------------------------------------------------------------------
# docs/parameters.md

def _doc_value(v):
    if v is None:
        return "None"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        v = list(v)
    if isinstance(v, str):
        return f'"{v}"'
    return repr(v)


def _doc_allowed(p: Param):
    if p.choices:
        return " / ".join(f"`{c}`" for c in p.choices)
    parts = [f"{s} {b:g}" for b, s in ((p.gt, ">"), (p.ge, ">="), (p.le, "<="), (p.lt, "<"))
             if b is not None]
    kind = {"int": "integer", "float": "number", "bool": "true / false", "str": "text",
            "int_list": "integers", "int_list_or_auto": "`auto` or integers", "table": "table",
            "int_or_none": "None or integer",
            "float_or_none": "None or number", "int_or_auto": "`auto` or integer",
            "layers": "None or layer indices"}[p.kind]
    return kind + (" " + ", ".join(parts) if parts else "")


def markdown() -> str:
    """The text of ``docs/parameters.md``."""
    lines = [
        "# Parameters",
        "",
        "<!-- generated by `python -m slide.params > docs/parameters.md` from slide/params.py;"
        " do not edit -->",
        "",
        "One table drives the Python API (`SlideClassifier` keywords), the `slide train` run",
        "configuration (TOML keys, `--set KEY=VALUE`) and this page, so their defaults agree.",
        "A config key marked *optional* may be left unset: the estimator's default (the same",
        "value) applies. `train.threads` (0 = all cores) and `train.seed` (default 0, so CLI",
        "runs are reproducible) are the CLI's spelling of `n_threads` and `random_state`.",
        "",
        "| keyword | config key | default | allowed | meaning |",
        "|---|---|---|---|---|",
    ]
    for p in TABLE:
        name = f"`{p.name}`" if p.name else "-"
        key = f"`{p.key}`" + (" (optional)" if p.optional and p.name else "") if p.key else "-"
        default = "not set" if p.default is None and p.key and not p.name else \
            f"`{_doc_value(p.default)}`"
        lines.append(f"| {name} | {key} | {default} | {_doc_allowed(p)} | {p.doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover - regenerates docs/parameters.md
    import sys
    sys.stdout.write(markdown())
