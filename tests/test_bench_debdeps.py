"""bench/build_debdeps.py on a small hand-written Packages / Translation-en pair (plain text)."""
import json

import numpy as np
import pytest

from bench import build_debdeps as bd
from slide import read_xc

PACKAGES = """Package: alpha
Maintainer: A Team <a@example.org>
Depends: libc6 (>= 2.34), libfoo1 | libfoo-alt [amd64], python3:any
Recommends: zlib1g <!nocheck>
Description: alpha tool for graphs
Description-md5: aaa
Homepage: https://www.alpha.example.org/x
Section: utils
Tag: role::program, interface::commandline

Package: beta
Maintainer: B <b@example.net>
Pre-Depends: libc6
Suggests: libfoo1, onlyonce
Description: beta library
Description-md5: bbb
Section: libs

Package: gamma
Maintainer: A Team <a@example.org>
Depends: python3, zlib1g, libfoo-alt
Description: gamma graphs in python
Description-md5: ccc
Section: python

Package: delta
Maintainer: D <d@example.org>
Depends: onlyelse
Description: delta has a dependency seen once
Description-md5: ddd
Section: misc

Package: eps
Maintainer: E <e@example.org>
Description: eps has no dependency at all
Description-md5: eee
Section: misc
""" + "".join(f"""
Package: pkg{i}
Maintainer: A Team <a@example.org>
Depends: libc6, python3{', zlib1g' if i % 2 else ''}
Description: filler graphs package {i}
Description-md5: m{i}
Section: utils
""" for i in range(10))

TRANSLATIONS = """Package: alpha
Description-md5: aaa
Description-en: alpha tool for graphs
 A long description mentioning plotting and networks.
"""


def test_dependency_names_strip_qualifiers_and_keep_alternatives():
    fields = next(bd.stanzas(PACKAGES))
    assert bd.dependency_names(fields) == ["libc6", "libfoo1", "libfoo-alt", "python3",
                                           "zlib1g"]


def test_features_never_read_dependency_fields():
    f = next(bd.stanzas(PACKAGES))
    toks = bd.feature_tokens(f, "long text")
    changed = dict(f, Depends="secretdep", Recommends="", Suggests="other", **{"Pre-Depends": "x"})
    assert bd.feature_tokens(changed, "long text") == toks
    assert not any("libfoo" in t or "zlib" in t for t in toks)
    assert {"name:alpha", "section:utils", "host:alpha.example.org", "tag:role::program",
            "maildomain:example.org", "word:long"} <= set(toks)


def test_build_end_to_end(tmp_path):
    (tmp_path / "Packages").write_text(PACKAGES)
    (tmp_path / "Translation-en").write_text(TRANSLATIONS)
    src = bd.main(["--packages", str(tmp_path / "Packages"), "--translations",
                   str(tmp_path / "Translation-en"), "--out", str(tmp_path / "out")])
    labels = (tmp_path / "out" / "labels.txt").read_text().split()
    # 'onlyonce' and 'onlyelse' occur once: dropped; delta is left without labels, eps has none
    assert labels == sorted(["libc6", "libfoo1", "libfoo-alt", "python3", "zlib1g"])
    assert src["n_points"] == 15 - 2 and src["build"]["points_dropped_no_label"] == 2
    assert src["n_train"] + src["n_test"] == 13 and src["n_train"] == 10
    assert src["build"]["points_with_long_description"] == 1
    X_tr, Y_tr = read_xc(tmp_path / "out" / "train.txt")
    X_te, Y_te = read_xc(tmp_path / "out" / "test.txt")
    assert X_tr.shape[0] == 10 and X_te.shape[0] == 3 and Y_tr.shape[1] == len(labels)
    assert (np.diff(Y_tr.indptr) > 0).all() and (np.diff(Y_te.indptr) > 0).all()
    norms = np.sqrt(np.asarray(X_tr.multiply(X_tr).sum(axis=1)).ravel())
    np.testing.assert_allclose(norms[norms > 0], 1.0, rtol=1e-5)     # rows L2-normalised
    on_disk = json.loads((tmp_path / "out" / "source.json").read_text())
    assert on_disk["files_sha256"] == src["files_sha256"] and on_disk["long_descriptions"]
    st = on_disk["labels_whole_set"]
    assert st["label_occurrences"] == Y_tr.nnz + Y_te.nnz
    assert st["avg_labels_per_point"] == pytest.approx((Y_tr.nnz + Y_te.nnz) / 13)
    # the same seed gives the same files; another seed another split
    again = bd.main(["--packages", str(tmp_path / "Packages"), "--translations",
                     str(tmp_path / "none"), "--out", str(tmp_path / "out2")])
    assert not again["long_descriptions"]
    other = bd.main(["--packages", str(tmp_path / "Packages"), "--translations",
                     str(tmp_path / "Translation-en"), "--out", str(tmp_path / "out3"),
                     "--seed", "5"])
    assert other["files_sha256"] != src["files_sha256"]


def test_missing_index_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        bd.read_index(tmp_path / "nope.lz4")
