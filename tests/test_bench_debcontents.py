"""bench/build_debcontents.py on small hand-written Packages / Contents / Release files (plain)."""
import json

import numpy as np
import pytest

from bench import build_debcontents as bc
from slide import read_xc

PACKAGES = "".join(f"""
Package: {name}
Maintainer: A Team <a@example.org>
{deps}Description: {desc}
Description-md5: m{name}
Section: {section}
""" for name, deps, desc, section in [
    ("alpha", "Depends: libc6 (>= 2), python3\n", "alpha tool", "utils"),
    ("beta", "Depends: python3\n", "beta tool", "utils"),
    ("gamma", "Depends: python3 | python3-dev\n", "gamma tool", "python"),
    ("delta", "", "delta library", "libs"),
    ("eps", "", "eps installs only its copyright", "misc"),
    ("notincontents", "", "no files listed", "misc"),
] + [(f"pkg{i}", "Depends: libc6\n", f"filler {i}", "misc") for i in range(14)])

# basenames: 'copyright' in all 19 packages (> 50 %: dropped), 'tool.py' in alpha/beta/gamma (3),
# 'rare.txt' in alpha/beta only (2 < 3: dropped), 'libx.so.1' in gamma, delta and in 'delta' a
# second time under another folder (counted once), 'has space.png' in 3, 'lib.so' in 4 fillers
CONTENTS_AMD64 = "\n".join(
    [f"usr/share/doc/{p}/copyright                 doc/{p}" for p in
     ["alpha", "beta", "gamma", "delta", "eps"] + [f"pkg{i}" for i in range(14)]]
    + ["usr/lib/x86_64-linux-gnu/libx.so.1   libs/gamma,libs/delta",
       "usr/lib/other/libx.so.1   libs/delta",
       "usr/lib/pkg/lib.so   misc/pkg0,misc/pkg1,contrib/misc/pkg2,misc/pkg3",
       "usr/bin/rare.txt  utils/alpha,utils/beta"]) + "\n"
CONTENTS_ALL = """usr/lib/python3/dist-packages/a/tool.py   python/alpha,utils/beta
usr/lib/python3/dist-packages/g/tool.py   python/gamma
usr/share/icons/My Theme/has space.png   x11/alpha,x11/beta,x11/gamma
usr/share/libx/libx.so.1   libs/pkg5
"""
RELEASE = "Origin: Debian\nDate: Sat, 11 Jul 2026 10:16:37 UTC\n"


def test_contents_entry_handles_spaces_areas_and_headers():
    assert bc.contents_entry("usr/share/icons/My Theme/a b.png   x11/t1,contrib/x11/t2") == (
        "usr/share/icons/My Theme/a b.png", ["t1", "t2"])
    assert bc.contents_entry("FILE                LOCATION") is None
    assert bc.contents_entry("") is None


def test_package_basenames_and_label_selection():
    files = bc.package_basenames(CONTENTS_AMD64.splitlines() + CONTENTS_ALL.splitlines())
    assert files["delta"] == {"copyright", "libx.so.1"}           # two folders, one label
    assert files["alpha"] == {"copyright", "rare.txt", "tool.py", "has space.png"}
    assert files["pkg2"] == {"copyright", "lib.so"}                # contrib/misc/pkg2
    kept, counts = bc.select_labels(list(files.values()), min_count=3, max_share=0.5)
    assert counts["copyright"] == 19 and counts["rare.txt"] == 2
    assert kept == sorted(["tool.py", "libx.so.1", "has space.png", "lib.so"])


def test_features_add_dependency_names_but_no_file():
    f = next(s for s in bc.stanzas(PACKAGES) if s["Package"] == "gamma")
    toks = bc.package_features(f, None)
    assert {"dep:python3", "dep:python3-dev", "name:gamma", "section:python"} <= set(toks)
    assert not any("tool.py" in t or "libx" in t for t in toks)


def test_build_end_to_end(tmp_path):
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / (bc.PACKAGES)).write_text(PACKAGES)
    (lists / bc.CONTENTS[0]).write_text(CONTENTS_AMD64)
    (lists / bc.CONTENTS[1]).write_text(CONTENTS_ALL)
    (lists / bc.RELEASE).write_text(RELEASE)
    src = bc.main(["--lists", str(lists), "--out", str(tmp_path / "out"),
                   "--max-label-share", "0.5"])
    labels = (tmp_path / "out" / "labels.txt").read_text().splitlines()
    assert labels == sorted(["tool.py", "libx.so.1", "has space.png", "lib.so"])
    b = src["build"]
    assert b["packages_in_index"] == 20 and b["index_packages_with_files"] == 19
    assert b["most_common_dropped"] == [["copyright", 19]]
    # alpha beta gamma delta pkg0..3 pkg5 have a kept label; eps and the other fillers do not
    assert src["n_points"] == 9 and b["points_dropped_no_label"] == 10
    assert src["n_train"] == 7 and src["n_test"] == 2 and src["n_labels"] == 4
    assert src["archive_release_date"] == "Sat, 11 Jul 2026 10:16:37 UTC"
    assert not src["long_descriptions"] and len(src["inputs"]) == 3
    assert src["git_commit"]
    X_tr, Y_tr = read_xc(tmp_path / "out" / "train.txt")
    X_te, Y_te = read_xc(tmp_path / "out" / "test.txt")
    assert Y_tr.shape[1] == Y_te.shape[1] == 4 and X_tr.shape[1] == src["n_features"]
    assert (np.diff(Y_tr.indptr) > 0).all() and (np.diff(Y_te.indptr) > 0).all()
    # labels per point, train + test: alpha/beta 2, gamma 3, delta 1, pkg0..3 1, pkg5 1
    assert sorted(np.diff(Y_tr.indptr).tolist() + np.diff(Y_te.indptr).tolist()) == \
        [1, 1, 1, 1, 1, 1, 2, 2, 3]
    names = (tmp_path / "out" / "train_points.txt").read_text().split() + \
        (tmp_path / "out" / "test_points.txt").read_text().split()
    assert sorted(names) == sorted(["alpha", "beta", "gamma", "delta", "pkg0", "pkg1", "pkg2",
                                    "pkg3", "pkg5"])
    n_lab = dict(zip(names, np.diff(Y_tr.indptr).tolist() + np.diff(Y_te.indptr).tolist()))
    assert n_lab["gamma"] == 3 and n_lab["alpha"] == 2 and n_lab["pkg5"] == 1
    first = (tmp_path / "out" / "train.txt").read_text().splitlines()
    assert first[0] == f"7 {src['n_features']} 4"                  # XC header
    assert all(line.split(" ")[0] and all(":" in t for t in line.split(" ")[1:])
               for line in first[1:])
    on_disk = json.loads((tmp_path / "out" / "source.json").read_text())
    assert on_disk["files_sha256"] == src["files_sha256"]
    assert on_disk["labels_whole_set"]["label_occurrences"] == Y_tr.nnz + Y_te.nnz == 13
    assert on_disk["label_frequency_quantiles"]["1.0"] == 4.0      # lib.so in pkg0..3
    assert on_disk["points_with_gt_1000_labels"] == 0
    again = bc.main(["--lists", str(lists), "--out", str(tmp_path / "out2"),
                     "--max-label-share", "0.5"])
    assert again["files_sha256"] == src["files_sha256"]            # deterministic


def test_missing_contents_is_a_clear_error(tmp_path):
    (tmp_path / bc.PACKAGES).write_text(PACKAGES)
    with pytest.raises(ValueError, match="Contents"):
        bc.main(["--lists", str(tmp_path), "--out", str(tmp_path / "out")])
