"""Raw-text data for ``slide train / evaluate / predict`` (JSONL or TSV files,
``slide.data.textfile``): the vectorizer of the run's ``[text]`` settings, fitted on the
training file only and kept in the run directory (``vectorizer.slide``), the label names of
the training file as the model's ``classes_``, and the final ``model.slide`` carrying its
vectorizer (``slide.load`` gives the ``Pipeline``)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from slide.cli.common import EXIT_DATA, CliError, _err, _info

VECTORIZER_FILE = "vectorizer.slide"


@dataclass
class TextRun:
    """What a text run adds to an XC one: the fitted steps and the training label names."""
    steps: list
    classes: object
    vectorize_seconds: float


def _transform(steps, texts):
    X = texts
    for _, step in steps:
        X = step.transform(X)
    return X


def _fit_transform(steps, texts):
    X = texts
    for _, step in steps:
        X = step.fit_transform(X)
    return X


def known_labels(classes, label_lists, path):
    """CSR of label names against the training ``classes``; names the training file never
    had are dropped (no output neuron could predict them: they count as misses in P@k),
    with a note on stderr."""
    import numpy as np
    import scipy.sparse as sp
    index = {c: j for j, c in enumerate(np.asarray(classes).tolist())}
    rows, cols, unseen, hit_rows = [], [], 0, set()
    for i, labs in enumerate(label_lists):
        for v in labs:
            j = index.get(v)
            if j is None:
                unseen += 1
                hit_rows.add(i)
                continue
            rows.append(i)
            cols.append(j)
    if unseen:
        _err(f"note: {path}: {unseen:,} labels on {len(hit_rows):,} lines are not among the "
             f"{len(index):,} labels of the training file and are left out (misses for P@k)")
    Y = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)),
                      shape=(len(label_lists), len(index)))
    Y.sum_duplicates()
    Y.data[:] = 1.0
    return Y


def load_text_data(cfg, run_dir, resume):
    """``((X_train, Y_train, X_pool, Y_pool, pool name), TextRun)`` of a run on JSONL / TSV
    files: the vectorizer is fitted on the training texts (loaded from the run directory on
    ``--resume``), the test file transformed with it."""
    from slide import labels as labels_mod
    from slide import text as text_mod
    from slide.data.textfile import read_text_file
    d = cfg["data"]
    fmt = d["format"]
    _info(f"reading {d['train']} ({fmt})")
    texts, label_lists = read_text_file(d["train"], fmt, need_labels=True)
    Y_tr, classes = labels_mod.encode(label_lists, name=d["train"])
    if classes is None:         # integer names in a text file are names, not ids
        classes = labels_mod.classes_array(labels_mod._distinct(label_lists))
        Y_tr, _ = labels_mod.encode(label_lists, name=d["train"], classes=classes)
    path = os.path.join(run_dir, VECTORIZER_FILE)
    t0 = time.perf_counter()
    if resume and os.path.exists(path):
        steps = text_mod.load_steps(path)
        X_tr = _transform(steps, texts)
    else:
        steps = text_mod.vectorizer_from_config(cfg["text"])
        X_tr = _fit_transform(steps, texts)
        text_mod.save_steps(path, steps)
    seconds = time.perf_counter() - t0
    _info(f"  {X_tr.shape[0]:,} documents, {X_tr.shape[1]:,} features, {len(classes):,} labels "
          f"(vectorizer {seconds:.1f} s, saved to {path})")
    run = TextRun(steps, classes, seconds)
    if d["test"] is None:
        return (X_tr, Y_tr, X_tr, Y_tr, "training file (no data.test given)"), run
    _info(f"reading {d['test']} ({fmt})")
    te_texts, te_labels = read_text_file(d["test"], fmt, need_labels=False)
    X_te = _transform(steps, te_texts)
    return (X_tr, Y_tr, X_te, known_labels(classes, te_labels, d["test"]), "test file"), run


def text_parts(model, run_dir):
    """``(text steps or None, classifier)`` of what ``--model`` loaded: a pipeline saved with
    its vectorizer, or a classifier whose run directory keeps ``vectorizer.slide``."""
    from sklearn.pipeline import Pipeline
    if isinstance(model, Pipeline):
        return list(model.steps[:-1]), model.steps[-1][1]
    path = os.path.join(run_dir, VECTORIZER_FILE) if run_dir else None
    if path and os.path.exists(path):
        from slide import text as text_mod
        return text_mod.load_steps(path), model
    return None, model


def read_text_for_model(path, steps, model, need_labels):
    """``(X, label lists)`` of a JSONL / TSV file for a text model."""
    from slide.data.textfile import read_text_file
    if steps is None:
        raise CliError(f"{path} is raw text, but the model carries no vectorizer (it was not "
                       f"trained on a .jsonl / .tsv file)", EXIT_DATA)
    texts, label_lists = read_text_file(path, need_labels=need_labels)
    return _transform(steps, texts), label_lists


def save_final(model, path, run, extra, **options):
    """The run's final model file: with the vectorizer for a text run. ``options``: the
    model's ``save``'s."""
    from slide import text as text_mod
    if run is None or not text_mod.carries_text(model):
        # no vectorizer (XC data), or a sharded model's directory: vectorizer.slide beside
        model.save(path, extra=extra, **options)
        return
    text_mod.save(with_text_steps(run.steps, model), path, extra=extra, **options)


def with_text_steps(steps, model):
    """The ``Pipeline`` of fitted text ``steps`` and ``model``, its step named as
    ``make_pipeline`` would name it."""
    from sklearn.pipeline import Pipeline
    return Pipeline(list(steps) + [(type(model).__name__.lower(), model)])
