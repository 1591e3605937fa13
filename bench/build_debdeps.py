"""Build *debdeps*: a real extreme multi-label data set from the Debian bookworm package index.

    python bench/build_debdeps.py [--out datasets/debdeps] [--seed 0]

Task: predict a package's dependency names (Depends + Pre-Depends + Recommends + Suggests,
alternatives ``a | b`` included, version ``(>= 1)``, architecture ``[amd64]``, ``:any`` and
build-profile ``<!nocheck>`` qualifiers stripped) from tf-idf-weighted tokens of its name, short
and long description, section, maintainer, homepage host and debtags. Dependency fields are
never read as features (they are the labels); ``Provides``/``Breaks``/``Conflicts``/``Replaces``
/``Enhances`` are not used at all.

Input: the ``Packages`` index apt keeps under ``/var/lib/apt/lists/`` (lz4; decompressed with
``/usr/lib/apt/apt-helper cat-file``) and, when present, the ``Translation-en`` index with the
long descriptions (``apt-get -o Acquire::Languages=en update`` fetches it); without it only
the short descriptions are used, and ``source.json`` says so.

Labels seen fewer than ``--min-label-count`` (2) times in the whole set are dropped, then points
left with no label. Fixed seeded 80/20 train/test split. tf-idf: tf = 1 + ln(count), idf =
ln(n_train / df) + 1 with df counted on the *training* split only, tokens with train df < 2
dropped, rows L2-normalised. Writes ``train.txt``/``test.txt`` (XC format, ``slide.write_xc``),
``labels.txt`` and ``features.txt`` (one name per id) and ``source.json`` (counts, label
statistics, input checksums, the command) into ``--out``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import scipy.sparse as sp

REPO = Path(__file__).resolve().parents[1]
LISTS = Path("/var/lib/apt/lists")
PACKAGES = LISTS / "deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages.lz4"
TRANSLATIONS = LISTS / "deb.debian.org_debian_dists_bookworm_main_i18n_Translation-en.lz4"
APT_HELPER = "/usr/lib/apt/apt-helper"
DEP_FIELDS = ("Depends", "Pre-Depends", "Recommends", "Suggests")
WORD = re.compile(r"[a-z0-9]+(?:[+.][a-z0-9]+)*")
QUALIFIERS = re.compile(r"\([^)]*\)|\[[^\]]*\]|<[^>]*>")


def read_index(path):
    """Text of an apt list file (lz4 through apt-helper; plain files as they are)."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path} does not exist (run 'apt-get update' first)")
    if path.suffix == ".lz4":
        out = subprocess.run([APT_HELPER, "cat-file", str(path)], capture_output=True,
                             check=True)
        return out.stdout.decode("utf-8", errors="replace")
    return path.read_text(errors="replace")


def stanzas(text):
    """Each RFC 822 stanza as a dict (continuation lines joined with newlines)."""
    for block in text.split("\n\n"):
        fields, key = {}, None
        for line in block.splitlines():
            if line.startswith((" ", "\t")) and key:
                fields[key] += "\n" + line[1:]
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if "Package" in fields:
            yield fields


def dependency_names(fields):
    """Distinct package names of the four dependency fields, qualifiers stripped."""
    names = []
    for f in DEP_FIELDS:
        for alt in QUALIFIERS.sub(" ", fields.get(f, "")).replace("|", ",").split(","):
            name = alt.strip().split(":")[0].strip().lower()
            if name and name not in names:
                names.append(name)
    return names


def feature_tokens(fields, long_description):
    """Field-prefixed tokens of one package (no dependency field is read)."""
    name = fields["Package"].lower()
    toks = ["name:" + name] + ["namepart:" + w for w in re.split(r"[-.+]", name) if w]
    short, _, rest = fields.get("Description", "").partition("\n")
    text = short + "\n" + (long_description or rest)
    toks += ["word:" + w for w in WORD.findall(text.lower())]
    if fields.get("Section"):
        toks.append("section:" + fields["Section"].lower())
    maint = fields.get("Maintainer", "").lower()
    if maint:
        toks.append("maintainer:" + maint)
        m = re.search(r"@([a-z0-9.-]+)", maint)
        if m:
            toks.append("maildomain:" + m.group(1))
    host = urlparse(fields.get("Homepage", "")).hostname
    if host:
        toks.append("host:" + host.lower().removeprefix("www."))
    toks += ["tag:" + t.strip() for t in fields.get("Tag", "").replace("\n", " ").split(",")
             if t.strip()]
    return toks


def long_descriptions(text):
    """(package, Description-md5) -> long description from a Translation-en index."""
    out = {}
    for f in stanzas(text):
        desc = f.get("Description-en", "")
        out[(f["Package"], f.get("Description-md5"))] = desc.partition("\n")[2]
    return out


def tfidf(docs, train_rows):
    """CSR tf-idf matrix of token lists; vocabulary and idf from the training rows only."""
    df = Counter()
    for i in train_rows:
        df.update(set(docs[i]))
    vocab = sorted(t for t, c in df.items() if c >= 2)
    index = {t: j for j, t in enumerate(vocab)}
    n_tr = len(train_rows)
    idf = np.array([math.log(n_tr / df[t]) + 1.0 for t in vocab], np.float32)
    indptr, indices, data = [0], [], []
    for toks in docs:
        counts = Counter(t for t in toks if t in index)
        cols = sorted(index[t] for t in counts)
        vals = np.array([(1.0 + math.log(counts[vocab[j]])) * idf[j] for j in cols], np.float32)
        norm = float(np.linalg.norm(vals)) if len(vals) else 1.0
        indices.extend(cols)
        data.extend((vals / norm).tolist())
        indptr.append(len(indices))
    X = sp.csr_matrix((np.array(data, np.float32), np.array(indices, np.int32),
                       np.array(indptr, np.int64)), shape=(len(docs), len(vocab)))
    return X, vocab


def label_statistics(Y):
    """Label counts, head/tail shares and the Zipf slope of the label-frequency curve."""
    counts = np.sort(np.asarray((Y > 0).sum(axis=0)).ravel())[::-1]
    counts = counts[counts > 0]
    total = int(counts.sum())
    top1 = max(1, int(round(0.01 * len(counts))))
    tail = counts <= 5
    ranks = np.arange(1, len(counts) + 1)
    slope = float(np.polyfit(np.log(ranks), np.log(counts), 1)[0])
    per_point = np.diff(Y.indptr)
    return {"labels_with_points": int(len(counts)), "label_occurrences": total,
            "avg_labels_per_point": float(per_point.mean()),
            "median_labels_per_point": float(np.median(per_point)),
            "max_labels_per_point": int(per_point.max()),
            "avg_points_per_label": float(counts.mean()),
            "max_points_per_label": int(counts[0]),
            "head_top1pct_labels": top1,
            "head_top1pct_occurrence_share": float(counts[:top1].sum() / total),
            "tail_labels_le5_points_share": float(tail.mean()),
            "tail_labels_le5_occurrence_share": float(counts[tail].sum() / total),
            "zipf_slope_loglog_rank_frequency": slope}


def _sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def vectorise_split(pkgs, rows, longs, featurize, seed):
    """(X, vocabulary, split permutation, n_train, rows with a long description): the tf-idf
    rows of packages ``rows`` (``featurize(stanza, long description)`` gives the tokens), idf
    counted on the training part of the seeded 80/20 split."""
    n_long = 0
    docs = []
    for i in rows:
        f = pkgs[i]
        long = longs.get((f["Package"], f.get("Description-md5")))
        n_long += bool(long)
        docs.append(featurize(f, long))
    perm = np.random.default_rng([int(seed), 2024]).permutation(len(rows))
    n_train = int(round(0.8 * len(rows)))
    X, vocab = tfidf(docs, perm[:n_train].tolist())
    return X, vocab, perm, n_train, n_long


def write_split(out, X, Y, perm, n_train, labels, vocab):
    """train.txt / test.txt (rows perm[:n_train] / the rest, each in their original order),
    labels.txt and features.txt in the folder ``out``; returns the two row lists."""
    from slide import write_xc
    tr, te = np.sort(perm[:n_train]), np.sort(perm[n_train:])
    out.mkdir(parents=True, exist_ok=True)
    write_xc(out / "train.txt", X[tr], Y[tr])
    write_xc(out / "test.txt", X[te], Y[te])
    (out / "labels.txt").write_text("\n".join(labels) + "\n")
    (out / "features.txt").write_text("\n".join(vocab) + "\n")
    return tr, te


def build(packages_path, translations_path, seed, min_label_count):
    """(X, Y, label names, feature names, split permutation, stats) of the whole set."""
    pkgs = list(stanzas(read_index(packages_path)))
    longs = {}
    if translations_path and Path(translations_path).exists():
        longs = long_descriptions(read_index(translations_path))
    deps = [dependency_names(f) for f in pkgs]
    counts = Counter(d for ds in deps for d in ds)
    kept = sorted(d for d, c in counts.items() if c >= min_label_count)
    label_id = {d: j for j, d in enumerate(kept)}
    rows = [i for i, ds in enumerate(deps) if any(d in label_id for d in ds)]
    X, vocab, perm, n_train, n_long = vectorise_split(pkgs, rows, longs, feature_tokens, seed)
    y_ind = [sorted(label_id[d] for d in deps[i] if d in label_id) for i in rows]
    Y = sp.csr_matrix((np.ones(sum(map(len, y_ind)), np.float32),
                       np.array([j for ys in y_ind for j in ys], np.int32),
                       np.concatenate([[0], np.cumsum([len(ys) for ys in y_ind])])),
                      shape=(len(rows), len(kept)))
    stats = {"packages_in_index": len(pkgs), "distinct_dependency_names": len(counts),
             "names_with_ge_min_count": len(kept), "points_with_a_label": len(rows),
             "points_dropped_no_label": len(pkgs) - len(rows),
             "points_with_long_description": n_long,
             "avg_dependency_names_per_package_before_filter":
                 float(np.mean([len(d) for d in deps]))}
    return X, Y, kept, vocab, perm, n_train, stats


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(REPO / "datasets" / "debdeps"))
    p.add_argument("--packages", default=str(PACKAGES), help="apt Packages index (lz4 or plain)")
    p.add_argument("--translations", default=str(TRANSLATIONS),
                   help="apt Translation-en index (long descriptions); missing = short only")
    p.add_argument("--seed", type=int, default=0, help="seed of the 80/20 split")
    p.add_argument("--min-label-count", type=int, default=2)
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    X, Y, labels, vocab, perm, n_train, stats = build(a.packages, a.translations, a.seed,
                                                      a.min_label_count)
    out = Path(a.out)
    tr, te = write_split(out, X, Y, perm, n_train, labels, vocab)
    Ytr = Y[tr]
    inputs = {str(a.packages): _sha256(a.packages)}
    if Path(a.translations).exists():
        inputs[str(a.translations)] = _sha256(a.translations)
    source = {
        "name": "debdeps", "command": " ".join(["python bench/build_debdeps.py"] + [
            shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:])]),
        "inputs_sha256": inputs,
        "long_descriptions": Path(a.translations).exists(),
        "seed": a.seed, "min_label_count": a.min_label_count,
        "n_points": int(X.shape[0]), "n_train": int(len(tr)), "n_test": int(len(te)),
        "n_features": int(X.shape[1]), "n_labels": int(Y.shape[1]),
        "avg_nnz": float(X.nnz / X.shape[0]),
        "labels_without_train_point": int((np.asarray((Ytr > 0).sum(axis=0)).ravel() == 0).sum()),
        "build": stats, "labels_whole_set": label_statistics(Y),
        "labels_train": label_statistics(Ytr),
        "files_sha256": {f: _sha256(out / f) for f in ("train.txt", "test.txt")},
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (out / "source.json").write_text(json.dumps(source, indent=1) + "\n")
    print(json.dumps({k: v for k, v in source.items() if k not in ("build",)}, indent=1))
    return source


if __name__ == "__main__":
    main()
