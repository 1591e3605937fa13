"""Raw text in: scikit-learn vectorizers in front of ``SlideClassifier``, saved in slide's own
format (docs/text.md).

``make_pipeline(TfidfVectorizer(sublinear_tf=True), SlideClassifier())`` is the Python API;
``slide.save(pipeline, path)`` writes it as one slide checkpoint that carries the fitted
vectorizer (its keywords as JSON, its vocabulary and idf as arrays: no pickle, so a file
from elsewhere runs no code when loaded), and ``slide.load(path)`` gives the ``Pipeline``
back. ``joblib.dump`` works as well (``SlideClassifier`` pickles through its checkpoint).

Supported steps before the classifier: ``TfidfVectorizer``, ``CountVectorizer``,
``HashingVectorizer``, ``TfidfTransformer`` (after a ``HashingVectorizer``: the recommended
form when the vocabulary does not fit), without callables (a custom ``tokenizer`` or
``preprocessor`` cannot be written without pickle: use joblib for those).

``vectorizer_from_config`` builds the vectorizer of a ``slide train`` run's ``[text]``
section (``slide.params``, keys ``text.*``).
"""
import json

import numpy as np
import scipy.sparse as sp
from sklearn.feature_extraction import text as fe
from sklearn.feature_extraction.text import (HashingVectorizer,
                                             TfidfTransformer, TfidfVectorizer)
from sklearn.pipeline import Pipeline

from slide.fileio import atomic_write
from slide.persist.checkpoint import save as save_checkpoint, save_ensemble

FORMAT_KEY = "text"         # the checkpoint metadata entry (slide.persist.checkpoint)
ARRAY_PREFIX = "text_"

_KINDS = ("TfidfVectorizer", "CountVectorizer", "HashingVectorizer", "TfidfTransformer")


def _classes():
    return {name: getattr(fe, name) for name in _KINDS}


def _json_params(step, where):
    """The step's keywords as JSON values; ValueError for one JSON cannot hold."""
    out = {}
    for k, v in step.get_params(deep=False).items():
        if k == "dtype":
            v = np.dtype(v).name
        elif isinstance(v, tuple):
            v = list(v)
        elif isinstance(v, (set, frozenset)):
            v = sorted(v)
        if callable(v):
            raise ValueError(f"{where}: {type(step).__name__}'s {k} is a callable ({v!r}); "
                             f"slide's format keeps no code: save this pipeline with "
                             f"joblib.dump instead")
        try:
            json.dumps(v)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: {type(step).__name__}'s {k}={v!r} cannot be written "
                             f"as JSON; save this pipeline with joblib.dump instead") from None
        out[k] = v
    return out


def step_state(step, where="step"):
    """``(meta, arrays)`` of one fitted text step."""
    kind = type(step).__name__
    if kind not in _KINDS or type(step) is not _classes()[kind]:
        raise ValueError(f"{where}: slide's format saves {', '.join(_KINDS)} before the "
                         f"classifier, not {kind}; save this pipeline with joblib.dump")
    meta = {"kind": kind, "params": _json_params(step, where)}
    arrays = {}
    if hasattr(step, "vocabulary_"):
        terms = sorted(step.vocabulary_, key=step.vocabulary_.get)
        arrays["vocabulary"] = np.array(terms, dtype=str)
    if getattr(step, "use_idf", False):
        arrays["idf"] = np.asarray(step.idf_, dtype=np.float64)
    if kind == "TfidfTransformer":
        meta["n_features"] = int(step.n_features_in_)
    return meta, arrays


def step_from_state(meta, arrays):
    """The fitted step of ``step_state``'s ``(meta, arrays)``."""
    kind = meta["kind"]
    if kind not in _KINDS:
        raise ValueError(f"unknown text step {kind!r}")
    params = dict(meta["params"])
    if "dtype" in params:
        params["dtype"] = np.dtype(params["dtype"]).type
    for k in ("ngram_range",):
        if isinstance(params.get(k), list):
            params[k] = tuple(params[k])
    step = _classes()[kind](**params)
    if kind in ("TfidfVectorizer", "CountVectorizer"):
        terms = arrays["vocabulary"].tolist()
        step.vocabulary_ = {t: j for j, t in enumerate(terms)}
        step._validate_vocabulary()
        step.vocabulary_ = {t: j for j, t in enumerate(terms)}
    if kind == "TfidfVectorizer":
        if step.use_idf:
            step.idf_ = arrays["idf"]
        else:
            step._tfidf = TfidfTransformer(norm=step.norm, use_idf=False,
                                           sublinear_tf=step.sublinear_tf)
            step._tfidf.fit(sp.csr_matrix((1, len(step.vocabulary_))))
    if kind == "TfidfTransformer":
        step.fit(sp.csr_matrix((1, int(meta["n_features"]))))
        if step.use_idf:
            step.idf_ = arrays["idf"]
    return step


def split_pipeline(pipe):
    """``(text steps [(name, step)], final (name, model))`` of a pipeline slide saves (its
    model a fitted ``SlideClassifier`` or ``SlideEnsemble``); ValueError otherwise."""
    if not isinstance(pipe, Pipeline):
        raise ValueError(f"expected a scikit-learn Pipeline, got {type(pipe).__name__}")
    *head, (name, last) = pipe.steps
    if not carries_text(last):
        sharded = ("a sharded model saves into a directory of shards (convert it with "
                   "slide.distributed.convert.to_single first); " if hasattr(last, "n_shards")
                   else "")
        raise ValueError("slide's format saves a pipeline ending in a fitted SlideClassifier "
                         f"or SlideEnsemble (got {type(last).__name__}); {sharded}save "
                         "others with joblib.dump")
    return head, (name, last)


def carries_text(model):
    """Whether ``model``'s file can hold the text steps in front of it: a fitted classifier's
    or ensemble's can; a sharded model saves into a directory of shards, which cannot."""
    return (hasattr(model, "members_")
            or (hasattr(model, "network_") and not hasattr(model, "n_shards")))


def pipeline_state(pipe):
    """``(meta, arrays)`` of the text steps of a fitted pipeline (the checkpoint's ``text``
    entry and its ``text_<i>_*`` arrays)."""
    head, (last_name, _) = split_pipeline(pipe)
    steps, arrays = [], {}
    for i, (name, step) in enumerate(head):
        meta, own = step_state(step, f"pipeline step {name!r}")
        steps.append(dict(meta, name=name))
        arrays.update({f"{ARRAY_PREFIX}{i}_{k}": v for k, v in own.items()})
    return {"steps": steps, "final": last_name}, arrays


def pipeline_from_state(model, meta, arrays):
    """The ``Pipeline`` of a loaded classifier and its checkpoint's text entry."""
    steps = []
    for i, st in enumerate(meta["steps"]):
        prefix = f"{ARRAY_PREFIX}{i}_"
        own = {n[len(prefix):]: arrays[n] for n in arrays if n.startswith(prefix)}
        steps.append((st["name"], step_from_state(st, own)))
    return Pipeline(steps + [(meta["final"], model)])


def save(obj, path, extra=None, **options):
    """Write a fitted ``SlideClassifier``, ``SlideEnsemble``, ``ShardedSlideClassifier``
    (``obj.save``) or a ``Pipeline`` of text steps and a ``SlideClassifier`` or
    ``SlideEnsemble`` (one file carrying the vectorizer) to ``path``; ``slide.load`` reads
    any of them back. ``options``: the model's ``save``'s (``optimizer_state``)."""
    if not isinstance(obj, Pipeline):
        return obj.save(path, extra=extra, **options)
    _, (_, model) = split_pipeline(obj)
    model._check_fitted()
    write = save_ensemble if hasattr(model, "members_") else save_checkpoint
    write(model, path, extra, attachment=pipeline_state(obj), **options)


# ---------------------------------------------------------------------------------------------
# the [text] section of a slide train run

def vectorizer_from_config(text):
    """The unfitted vectorizer steps of a run's ``[text]`` section (a dict of its keys):
    ``[(name, step)]`` ready for ``Pipeline``."""
    ngrams = (1, int(text["ngram_max"]))
    common = dict(lowercase=bool(text["lowercase"]), ngram_range=ngrams,
                  token_pattern=text["token_pattern"], dtype=np.float32,
                  strip_accents=text["strip_accents"])
    if text["vectorizer"] == "hashing":
        return [("hashingvectorizer", HashingVectorizer(
                    n_features=int(text["n_features"]), alternate_sign=False, norm=None,
                    **common)),
                ("tfidftransformer", TfidfTransformer(sublinear_tf=bool(text["sublinear_tf"])))]
    return [("tfidfvectorizer", TfidfVectorizer(
        sublinear_tf=bool(text["sublinear_tf"]), min_df=int(text["min_df"]),
        max_df=float(text["max_df"]), max_features=text["max_features"], **common))]


# ---------------------------------------------------------------------------------------------
# the text steps alone (a run directory's vectorizer.slide)

STEPS_FORMAT = "slide-text-steps"


def save_steps(path, steps):
    """Write fitted text steps ``[(name, step)]`` to ``path`` atomically: an npz archive with
    a JSON ``__meta__`` (no pickle)."""
    meta, arrays = [], {}
    for i, (name, step) in enumerate(steps):
        m, own = step_state(step, f"text step {name!r}")
        meta.append(dict(m, name=name))
        arrays.update({f"{ARRAY_PREFIX}{i}_{k}": v for k, v in own.items()})
    head = {"format": STEPS_FORMAT, "version": 1, "steps": meta}
    with atomic_write(path, "wb") as f:
        np.savez(f, __meta__=np.frombuffer(json.dumps(head).encode(), dtype=np.uint8), **arrays)


def load_steps(path):
    """The fitted text steps ``[(name, step)]`` that ``save_steps`` wrote; ValueError naming
    the file otherwise."""
    try:
        with np.load(path, allow_pickle=False) as z:
            head = json.loads(z["__meta__"].tobytes().decode())
            arrays = {k: z[k] for k in z.files if k != "__meta__"}
        if head.get("format") != STEPS_FORMAT:
            raise ValueError("not a slide text-steps file")
        steps = []
        for i, st in enumerate(head["steps"]):
            prefix = f"{ARRAY_PREFIX}{i}_"
            own = {n[len(prefix):]: a for n, a in arrays.items() if n.startswith(prefix)}
            steps.append((st["name"], step_from_state(st, own)))
        return steps
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: unreadable text vectorizer ({exc})") from None
