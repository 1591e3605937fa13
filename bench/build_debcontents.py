"""Build *debcontents*: a real >= 100k-label extreme multi-label set from Debian's archive indices.

    python bench/build_debcontents.py [--lists /var/lib/apt/lists] [--out datasets/debcontents]

Task: predict the **file names** a Debian package installs from tf-idf-weighted tokens of its
name, descriptions, section, maintainer, homepage host, debtags (``build_debdeps.feature_tokens``)
and the names of the packages it depends on (``dep:<name>``, ``build_debdeps.dependency_names``).
One point per binary package of the bookworm ``main`` amd64 ``Packages`` index; its labels are
the distinct *basenames* of the files it installs, read from the ``Contents-amd64`` and
``Contents-all`` indices (one line per file: ``path  section/package[,section/package...]``).
No Contents data is read as a feature.

Label filter (counts over the packages that are points): a basename kept must be installed by at
least ``--min-label-count`` (3) packages, so that a label is usually seen in training, and by at
most ``--max-label-share`` (5 %) of them, which drops the near-universal ``copyright``,
``changelog.Debian.gz``, ``README``, ``__init__.py``, ``index.html`` ...; then points left with no
label are dropped. Why basenames: on bookworm, full paths shared by >= 2 packages number only
~44k (Debian forbids file clashes) and parent directories ~18k, whereas basenames in 3+ packages
number ~133k with a heavy tail (median 4 packages a label, a few thousand at most).

Input (apt keeps them in ``/var/lib/apt/lists/``, lz4, read through ``apt-helper cat-file``):
``apt-get install apt-file`` (its ``/etc/apt/apt.conf.d/50apt-file.conf`` enables the Contents
indices), then ``apt-get -o Acquire::Languages=en update`` (Contents + Translation-en; this is
what ``apt-file update`` does). ``--lists`` points at another lists folder; README shows how to
fetch into one without touching the system's.

Split, tf-idf and output files as ``build_debdeps``: fixed seeded 80/20 split, idf from the
training split, tokens with train df < 2 dropped, rows L2-normalised; ``train.txt``/``test.txt``
(XC format, ``slide.write_xc``), ``labels.txt``, ``features.txt``, ``train_points.txt`` /
``test_points.txt`` (the package of each row), ``source.json`` (input names, sizes, sha256, the
archive's Release date, shape, label statistics, git commit of this script).
"""
from __future__ import annotations

import argparse
import datetime
import json
import posixpath
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import scipy.sparse as sp

if __package__ in (None, ""):                      # run as a script: make 'bench' importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.build_debdeps import (APT_HELPER, _sha256, dependency_names, feature_tokens,  # noqa: E402
                                 label_statistics, long_descriptions, read_index, stanzas,
                                 vectorise_split, write_split)

REPO = Path(__file__).resolve().parents[1]
LISTS = Path("/var/lib/apt/lists")
PREFIX = "deb.debian.org_debian_dists_bookworm_"
PACKAGES = PREFIX + "main_binary-amd64_Packages"
TRANSLATIONS = PREFIX + "main_i18n_Translation-en"
CONTENTS = (PREFIX + "main_Contents-amd64", PREFIX + "main_Contents-all")
RELEASE = PREFIX + "InRelease"


def find_list(lists, stem):
    """The apt list file ``stem`` in ``lists`` under any compression (or none); None if absent."""
    lists = Path(lists)
    for suffix in ("", ".lz4", ".gz", ".xz", ".zst", ".bz2"):
        if (lists / (stem + suffix)).exists():
            return lists / (stem + suffix)
    return None


def text_lines(path):
    """Lines of an apt list file, streamed (compressed files through ``apt-helper cat-file``)."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path} does not exist (see the module docstring: apt-file, update)")
    if path.suffix in (".lz4", ".gz", ".xz", ".zst", ".bz2"):
        proc = subprocess.Popen([APT_HELPER, "cat-file", str(path)], stdout=subprocess.PIPE)
        try:
            for raw in proc.stdout:
                yield raw.decode("utf-8", errors="replace").rstrip("\n")
        finally:
            proc.stdout.close()
            if proc.wait() != 0:
                raise RuntimeError(f"apt-helper cat-file {path} failed")
    else:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                yield line.rstrip("\n")


def contents_entry(line):
    """(path, [package names]) of one Contents line, or None for a blank/header line.

    The path may contain spaces; the location list after the last whitespace run never does.
    A location is ``[area/]section/package``: the package is its last component.
    """
    parts = line.rstrip().rsplit(None, 1)
    if len(parts) != 2 or parts[0] == "FILE":
        return None
    path, locations = parts[0].rstrip(), parts[1]
    return path, [loc.rsplit("/", 1)[-1] for loc in locations.split(",") if loc]


def package_basenames(lines):
    """package name -> set of the basenames of the files it installs (over all ``lines``)."""
    out, intern = {}, {}
    for line in lines:
        entry = contents_entry(line)
        if entry is None:
            continue
        base = posixpath.basename(entry[0])
        base = intern.setdefault(base, base)
        for pkg in entry[1]:
            out.setdefault(pkg, set()).add(base)
    return out


def select_labels(label_sets, min_count, max_share):
    """Sorted labels in >= ``min_count`` and <= ``max_share`` of the sets, and their counts."""
    counts = Counter(b for s in label_sets for b in s)
    cap = max_share * len(label_sets)
    kept = sorted(b for b, c in counts.items() if min_count <= c <= cap)
    return kept, counts


def package_features(fields, long_description):
    """``build_debdeps.feature_tokens`` plus ``dep:<name>`` of each dependency name."""
    return feature_tokens(fields, long_description) + ["dep:" + d for d in dependency_names(fields)]


def release_date(path):
    """The ``Date:`` of a (In)Release file, or None."""
    if path is None:
        return None
    for line in text_lines(path):
        if line.startswith("Date:"):
            return line.partition(":")[2].strip()
    return None


def build(packages_path, translations_path, contents_paths, seed, min_label_count,
          max_label_share):
    """(X, Y, label names, feature names, split permutation, n_train, stats) of the whole set."""
    pkgs = list(stanzas(read_index(packages_path)))
    longs = {}
    if translations_path and Path(translations_path).exists():
        longs = long_descriptions(read_index(translations_path))
    files = {}
    n_lines = 0
    for path in contents_paths:
        def counted(lines):
            nonlocal n_lines
            for line in lines:
                n_lines += 1
                yield line
        for pkg, bases in package_basenames(counted(text_lines(path))).items():
            files.setdefault(pkg, set()).update(bases)
    # one point per package of the index that installs files (a name once: the first stanza)
    seen, cand = set(), []
    for i, f in enumerate(pkgs):
        if f["Package"] in files and f["Package"] not in seen:
            seen.add(f["Package"])
            cand.append(i)
    label_sets = [files[pkgs[i]["Package"]] for i in cand]
    kept, counts = select_labels(label_sets, min_label_count, max_label_share)
    label_id = {b: j for j, b in enumerate(kept)}
    y_all = [sorted(label_id[b] for b in s if b in label_id) for s in label_sets]
    keep = [k for k, ys in enumerate(y_all) if ys]
    rows = [cand[k] for k in keep]
    y_ind = [y_all[k] for k in keep]
    X, vocab, perm, n_train, n_long = vectorise_split(pkgs, rows, longs, package_features, seed)
    Y = sp.csr_matrix((np.ones(sum(map(len, y_ind)), np.float32),
                       np.array([j for ys in y_ind for j in ys], np.int32),
                       np.concatenate([[0], np.cumsum([len(ys) for ys in y_ind])]).astype(
                           np.int64)), shape=(len(rows), len(kept)))
    too_common = sorted(((c, b) for b, c in counts.items()
                         if c > max_label_share * len(label_sets)), reverse=True)
    stats = {"point_names": [pkgs[i]["Package"] for i in rows],
             "packages_in_index": len(pkgs), "contents_lines": n_lines,
             "packages_in_contents": len(files),
             "index_packages_with_files": len(cand),
             "distinct_basenames": len(counts),
             "basenames_kept": len(kept),
             "basenames_below_min_count": sum(c < min_label_count for c in counts.values()),
             "basenames_above_max_share": len(too_common),
             "most_common_dropped": [[b, c] for c, b in too_common[:10]],
             "points_with_a_label": len(rows),
             "points_dropped_no_label": len(cand) - len(rows),
             "points_with_long_description": n_long,
             "avg_basenames_per_package_before_filter":
                 float(np.mean([len(s) for s in label_sets])) if label_sets else 0.0}
    return X, Y, kept, vocab, perm, n_train, stats


def _describe(path):
    p = Path(path)
    return {"file": str(p), "bytes": p.stat().st_size, "sha256": _sha256(p),
            "modified_utc": datetime.datetime.fromtimestamp(
                p.stat().st_mtime, datetime.timezone.utc).isoformat(timespec="seconds")}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(REPO / "datasets" / "debcontents"))
    p.add_argument("--lists", default=str(LISTS),
                   help="apt lists folder holding Packages, Translation-en, Contents-{amd64,all}")
    p.add_argument("--packages", help="Packages index (default: found in --lists)")
    p.add_argument("--translations", help="Translation-en index (default: found in --lists; "
                                          "missing = short descriptions only)")
    p.add_argument("--contents", nargs="+",
                   help="Contents indices (default: Contents-amd64 and Contents-all in --lists)")
    p.add_argument("--seed", type=int, default=0, help="seed of the 80/20 split")
    p.add_argument("--min-label-count", type=int, default=3)
    p.add_argument("--max-label-share", type=float, default=0.05)
    a = p.parse_args(argv)
    from bench.common import git_commit
    t0 = time.perf_counter()
    packages = a.packages or find_list(a.lists, PACKAGES)
    translations = a.translations or find_list(a.lists, TRANSLATIONS)
    contents = a.contents or [find_list(a.lists, s) for s in CONTENTS]
    if packages is None or any(c is None for c in contents):
        raise ValueError(f"no Packages or Contents index in {a.lists} (apt-get install apt-file; "
                         f"apt-get update)")
    X, Y, labels, vocab, perm, n_train, stats = build(
        packages, translations, contents, a.seed, a.min_label_count, a.max_label_share)
    out = Path(a.out)
    tr, te = write_split(out, X, Y, perm, n_train, labels, vocab)
    for name, idx in (("train_points.txt", tr), ("test_points.txt", te)):   # package per row
        (out / name).write_text("".join(stats["point_names"][i] + "\n" for i in idx))
    Ytr = Y[tr]
    has_long = translations is not None and Path(translations).exists()
    inputs = [_describe(packages)] + [_describe(c) for c in contents]
    if has_long:
        inputs.append(_describe(translations))
    release = find_list(Path(packages).parent, RELEASE)
    counts = np.asarray((Y > 0).sum(axis=0)).ravel()
    per_point = np.diff(Y.indptr)
    qs = (0.0, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)
    source = {
        "name": "debcontents", "command": " ".join(["python bench/build_debcontents.py"] + [
            shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:])]),
        "git_commit": git_commit(),
        "built_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "archive_release_date": release_date(release),
        "inputs": inputs,
        "long_descriptions": has_long,
        "seed": a.seed, "min_label_count": a.min_label_count,
        "max_label_share": a.max_label_share,
        "n_points": int(X.shape[0]), "n_train": int(len(tr)), "n_test": int(len(te)),
        "n_features": int(X.shape[1]), "n_labels": int(Y.shape[1]),
        "avg_nnz": float(X.nnz / max(1, X.shape[0])),
        "labels_without_train_point": int((np.asarray((Ytr > 0).sum(axis=0)).ravel() == 0).sum()),
        "label_frequency_quantiles": {str(q): float(np.quantile(counts, q)) for q in qs}
        if len(counts) else {},
        "labels_per_point_quantiles": {str(q): float(np.quantile(per_point, q)) for q in qs}
        if len(per_point) else {},
        # a few documentation / icon / font packages install thousands of shared file names
        "points_with_gt_1000_labels": int((per_point > 1000).sum()),
        "points_with_ge_2048_labels": int((per_point >= 2048).sum()),
        "occurrence_share_of_points_with_gt_1000_labels":
            float(per_point[per_point > 1000].sum() / max(1, per_point.sum())),
        "build": {k: v for k, v in stats.items() if k != "point_names"},
        "labels_whole_set": label_statistics(Y),
        "labels_train": label_statistics(Ytr),
        "files_sha256": {f: _sha256(out / f) for f in ("train.txt", "test.txt", "labels.txt")},
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (out / "source.json").write_text(json.dumps(source, indent=1) + "\n")
    print(json.dumps({k: v for k, v in source.items() if k not in ("build", "inputs")}, indent=1))
    return source


if __name__ == "__main__":
    main()
