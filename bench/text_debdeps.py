"""debdeps from raw text: scikit-learn vectorizers + ``SlideClassifier()`` against the
hand-built features of ``bench/build_debdeps.py``, and sentence-embedding-like dense input.

    python bench/text_debdeps.py [--out bench/results/text_debdeps] [--seed 0] [--only a,b]

The task and rows are debdeps' (a package's dependency names from its index entry; labels
seen at least twice; the same seeded 80/20 split, ``build_debdeps.vectorise_split``). Each
package becomes one raw document: its index fields as text (``Package``, ``Section``,
``Maintainer``, ``Homepage``, ``Tag``, the short and the long description; no dependency
field), its labels the dependency *names*. That set is written as
``datasets/debdeps_text/{train,test}.jsonl`` (the input of ``slide train``; git-ignored).

Rows of the result, each one fit of ``SlideClassifier(random_state=seed)`` (every other
parameter at its default) on the same training rows:

- ``hand``: build_debdeps' field-prefixed tokens and its own tf-idf (the published debdeps);
- ``tfidf_*``: ``TfidfVectorizer`` settings over the raw documents (``make_pipeline``);
- ``tfidf_recommended``: ``sublinear_tf=True, min_df=2``, ``token_pattern=WORDS`` (the
  ``[text]`` defaults since this script's sweep, ``bench/results/text_debdeps_sweep.json``);
- ``hashing`` / ``hashing_recommended``: ``HashingVectorizer(2**20)`` +
  ``TfidfTransformer(sublinear_tf=True)`` (token pattern ``SLIDE_PATTERN`` / ``WORDS``);
- ``svd256`` / ``svd256_recommended``: dense 256-dimensional rows, the L2-normalised
  ``TruncatedSVD`` of the ``tfidf_slide`` / ``tfidf_recommended`` features (no sentence model
  is available offline: the SVD stands in for sentence embeddings, a dense float matrix of
  the same shape);
- ``cli``: ``slide train --train train.jsonl --test test.jsonl`` with the ``[text]`` defaults,
  then ``slide evaluate --json``.

P@k is counted by label name over every test row (a test row's labels that no training row
has count as misses for every row). Seconds: the vectorizer's fit on the training documents
and transform of the test documents; ``train_seconds_`` (slide's training clock: network,
vote and re-ranker, compilation excluded); the exact top-5 prediction of the test rows.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import build_debdeps as bd  # noqa: E402
from bench.common import git_commit, machine_description  # noqa: E402

DATA = REPO / "datasets" / "debdeps_text"
# keeps 'libfoo-dev', 'python3.11', one-letter words whole (text.token_pattern's default
# until this script measured it 2.2 P@1 points below scikit-learn's default pattern)
SLIDE_PATTERN = r"(?u)\b\w[\w.+-]*\w\b|\b\w\b"
WORDS = r"(?u)\b\w+\b"      # text.token_pattern's default: words, one-letter ones kept


def document(fields, long_description):
    """A package's index entry as raw text, without its dependency fields."""
    short, _, rest = fields.get("Description", "").partition("\n")
    lines = [f"Package: {fields['Package']}"]
    for key in ("Section", "Maintainer", "Homepage", "Tag"):
        if fields.get(key):
            lines.append(f"{key}: {fields[key]}")
    lines.append(f"Description: {short}")
    lines.append(long_description or rest)
    return "\n".join(lines)


def build(seed, min_label_count=2):
    """(docs, label name lists, hand-built X, train rows, test rows, long-description count)."""
    pkgs = list(bd.stanzas(bd.read_index(bd.PACKAGES)))
    longs = {}
    if bd.TRANSLATIONS.exists():
        longs = bd.long_descriptions(bd.read_index(bd.TRANSLATIONS))
    deps = [bd.dependency_names(f) for f in pkgs]
    counts = Counter(d for ds in deps for d in ds)
    kept = {d for d, c in counts.items() if c >= min_label_count}
    rows = [i for i, ds in enumerate(deps) if any(d in kept for d in ds)]
    X_hand, _, perm, n_train, n_long = bd.vectorise_split(pkgs, rows, longs,
                                                          bd.feature_tokens, seed)
    docs, names = [], []
    for i in rows:
        f = pkgs[i]
        docs.append(document(f, longs.get((f["Package"], f.get("Description-md5")))))
        names.append(sorted(d for d in deps[i] if d in kept))
    tr, te = np.sort(perm[:n_train]), np.sort(perm[n_train:])
    return docs, names, X_hand, tr, te, n_long


def write_jsonl(path, docs, names):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for d, y in zip(docs, names):
            f.write(json.dumps({"text": d, "labels": y}) + "\n")


def precision_by_name(top_names, true_names, ks=(1, 3, 5)):
    out = {}
    for k in ks:
        hits = [len(set(t[:k]) & set(y)) / k for t, y in zip(top_names, true_names)]
        out[f"P@{k}"] = round(float(np.mean(hits)), 4)
    return out


def fit_and_score(X_tr, Y_tr, X_te, Y_te, seed, classes=None):
    """One ``SlideClassifier()`` fit; its P@k by name and its seconds."""
    import slide
    m = slide.SlideClassifier(random_state=seed)
    t0 = time.perf_counter()
    m.fit(X_tr, Y_tr, classes=classes)
    wall = time.perf_counter() - t0
    t0 = time.perf_counter()
    top = m.predict_topk(X_te, k=5, return_names=True)
    predict = time.perf_counter() - t0
    res = precision_by_name(top.tolist(), Y_te)
    res.update(train_seconds=round(m.train_seconds_, 2), fit_wall_seconds=round(wall, 2),
               compile_seconds=round(m.compile_seconds_, 2),
               predict_seconds=round(predict, 2), n_features=int(X_tr.shape[1]))
    return res


def vectorizers():
    from sklearn.feature_extraction.text import (HashingVectorizer, TfidfTransformer,
                                                 TfidfVectorizer)
    f32 = dict(dtype=np.float32)
    return {
        "tfidf_default": [TfidfVectorizer(**f32)],
        "tfidf_sublinear": [TfidfVectorizer(sublinear_tf=True, min_df=2, **f32)],
        "tfidf_slide": [TfidfVectorizer(sublinear_tf=True, min_df=2,
                                        token_pattern=SLIDE_PATTERN, **f32)],
        "tfidf_slide_linear_tf": [TfidfVectorizer(min_df=2, token_pattern=SLIDE_PATTERN, **f32)],
        "tfidf_slide_bigrams": [TfidfVectorizer(sublinear_tf=True, min_df=2, ngram_range=(1, 2),
                                                token_pattern=SLIDE_PATTERN, **f32)],
        "hashing": [HashingVectorizer(n_features=2**20, alternate_sign=False, norm=None,
                                      token_pattern=SLIDE_PATTERN, **f32),
                    TfidfTransformer(sublinear_tf=True)],
        "tfidf_recommended": [TfidfVectorizer(sublinear_tf=True, min_df=2, token_pattern=WORDS,
                                              **f32)],
        "hashing_recommended": [HashingVectorizer(n_features=2**20, alternate_sign=False,
                                                  norm=None, token_pattern=WORDS, **f32),
                                TfidfTransformer(sublinear_tf=True)],
    }


def vectorize(steps, train_docs, test_docs):
    t0 = time.perf_counter()
    X_tr = train_docs
    for s in steps:
        X_tr = s.fit_transform(X_tr)
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    X_te = test_docs
    for s in steps:
        X_te = s.transform(X_te)
    return X_tr, X_te, round(fit_s, 2), round(time.perf_counter() - t0, 2)


def run_svd(X_tr, X_te, seed, dims=256):
    from sklearn.decomposition import TruncatedSVD
    from sklearn.preprocessing import normalize
    t0 = time.perf_counter()
    svd = TruncatedSVD(n_components=dims, random_state=seed)
    E_tr = normalize(svd.fit_transform(X_tr)).astype(np.float32)
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    E_te = normalize(svd.transform(X_te)).astype(np.float32)
    return E_tr, E_te, round(fit_s, 2), round(time.perf_counter() - t0, 2)


def run_cli(seed, out_dir):
    """``slide train`` + ``slide evaluate`` on the JSONL files; (P@k, seconds)."""
    import io
    from contextlib import redirect_stdout
    from slide.cli import main
    run = out_dir / "cli_run"
    t0 = time.perf_counter()
    code = main(["train", "--train", str(DATA / "train.jsonl"), "--test",
                 str(DATA / "test.jsonl"), "--overwrite", "--set", f"output_dir={run}",
                 "--set", f"train.seed={seed}", "--set", "train.eval_every_batches=0",
                 "--set", "train.checkpoint_every_batches=0"])
    wall = time.perf_counter() - t0
    if code != 0:
        raise RuntimeError(f"slide train exited {code}")
    buf = io.StringIO()
    with redirect_stdout(buf):
        code = main(["evaluate", "--model", str(run), "--data", str(DATA / "test.jsonl"),
                     "--json"])
    res = json.loads(buf.getvalue())
    summary = json.loads((run / "summary.json").read_text())
    return {"P@1": round(res["P@1"], 4), "P@3": round(res["P@3"], 4),
            "P@5": round(res["P@5"], 4), "train_seconds": summary["slide"]["train_seconds"],
            "train_wall_seconds": round(wall, 2)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "text_debdeps"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default=None, help="comma-separated rows to run")
    a = p.parse_args(argv)
    only = None if a.only is None else set(a.only.split(","))
    want = (lambda name: only is None or name in only)  # noqa: E731
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    commit = git_commit()
    t0 = time.perf_counter()
    docs, names, X_hand, tr, te, n_long = build(a.seed)
    write_jsonl(DATA / "train.jsonl", [docs[i] for i in tr], [names[i] for i in tr])
    write_jsonl(DATA / "test.jsonl", [docs[i] for i in te], [names[i] for i in te])
    built = round(time.perf_counter() - t0, 1)
    docs_tr, docs_te = [docs[i] for i in tr], [docs[i] for i in te]
    y_tr, y_te = [names[i] for i in tr], [names[i] for i in te]
    rows = {}
    if want("hand"):
        rows["hand"] = fit_and_score(X_hand[tr], y_tr, X_hand[te], y_te, a.seed)
        print("hand", rows["hand"], flush=True)
    feats = {}
    svd_of = {"svd256": "tfidf_slide", "svd256_recommended": "tfidf_recommended"}
    for name, steps in vectorizers().items():
        if not (want(name) or any(want(k) and v == name for k, v in svd_of.items())):
            continue
        X_tr, X_te, fit_s, tr_s = vectorize(steps, docs_tr, docs_te)
        feats[name] = (X_tr, X_te)
        if want(name):
            rows[name] = dict(fit_and_score(X_tr, y_tr, X_te, y_te, a.seed),
                              vectorizer_fit_seconds=fit_s, vectorizer_transform_seconds=tr_s)
            print(name, rows[name], flush=True)
    for row, source in svd_of.items():
        if not want(row):
            continue
        E_tr, E_te, fit_s, tr_s = run_svd(*feats[source], a.seed)
        rows[row] = dict(fit_and_score(E_tr, y_tr, E_te, y_te, a.seed),
                         svd_fit_seconds=fit_s, svd_transform_seconds=tr_s)
        print(row, rows[row], flush=True)
    if want("cli"):
        rows["cli"] = run_cli(a.seed, Path(os.environ.get("TMPDIR", "/tmp")))
        print("cli", rows["cli"], flush=True)
    result = {"commit": commit, "command": "python bench/text_debdeps.py "
              + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": machine_description(), "seed": a.seed,
              "n_train": int(len(tr)), "n_test": int(len(te)),
              "documents_with_long_description": int(n_long),
              "labels_seen_in_training": len({v for y in y_tr for v in y}),
              "build_seconds": built, "rows": rows}
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
