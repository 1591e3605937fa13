"""The docs cite only what exists: every results file named in a doc, in slide's docstrings or
in a test is under bench/results/, every bench/ script named exists, and no docstring or doc
points at the probes and one-off studies that left the tree (git history keeps them)."""
import glob
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")

# names a doc uses for a file a command writes, not for a file in bench/results/
GENERIC = {"results.md", "results.json", "summary.md", "summary.json", "metrics.jsonl",
           "source.json", "README.md", "config.json", "train.txt", "test.txt", "labels.txt",
           "features.txt", "train.jsonl", "test.jsonl", "model.npz", "propensities.json",
           "time_to_accuracy.png", "runs/", "data/", "results/", "bench/results/"}
RESULT_EXT = (".md", ".jsonl", ".json", ".log", ".png", ".txt")

# Modules being rewritten on another branch whose docstrings still name a removed probe, study
# script or results file: exempt from the checks below until then. The set may only shrink
# (test_pending_modules_still_need_the_exemption says when an entry can go).
PENDING = set()
# scripts the docs name before they are committed
EXPECTED_SCRIPTS = set()
# a citation followed this closely by these words names something that left the tree
REMOVED = re.compile(r"git history|has left the tree|since removed")


def tracked(*patterns):
    out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    return [p for p in out if not p.startswith("bench/results/")]


def docs():
    return tracked("*.md")


def sources():
    return tracked("slide/*.py", "tests/*.py")


def expand_braces(pattern):
    m = re.search(r"\{([^{}]*)\}", pattern)
    if m is None:
        return [pattern]
    return [e for alt in m.group(1).split(",")
            for e in expand_braces(pattern[:m.start()] + alt + pattern[m.end():])]


def exists_anywhere(name, doc):
    """``name`` (globs and brace groups allowed) names an existing path: from the repository
    root, from the doc's folder, or under bench/results/."""
    bases = [ROOT, os.path.join(ROOT, os.path.dirname(doc)), RESULTS]
    for alt in expand_braces(name):
        if not any(glob.glob(os.path.join(base, alt)) for base in bases):
            return False
    return True


def removed_after(text, end):
    return REMOVED.search(text[end:end + 100]) is not None


def result_citations(text):
    """Results-file citations: anything after ``bench/results/`` (or ``results/`` in
    bench/README.md), and backticked names in the results files' style: a name with a commit
    (``name_<7 hex digits>``), a glob or a brace group, ending like a results file or folder."""
    out = set()
    for m in re.finditer(r"(?<![\w/])(?:bench/)?results/([\w.*{},/+-]+)", text):
        if removed_after(text, m.end()) or re.search(r"--out[ =]$", text[:m.start()]):
            continue                       # removed, or where a command writes its output
        out.add(m.group(1).rstrip(".,;:)"))
    for m in re.finditer(r"`([\w.*{},/+-]+)`", text):
        tok = m.group(1).rstrip(".,;:")
        if tok in GENERIC or removed_after(text, m.end()) or "{a,b}" in tok:
            continue
        styled = re.search(r"_[0-9a-f]{7}(?:[_./]|$)", tok) or re.search(r"[*{]", tok)
        if styled and (tok.endswith(RESULT_EXT) or tok.endswith("/")):
            out.add(tok)
    return {c for c in out if c and c not in GENERIC}


def checked():
    return sorted(set(docs() + sources()) - PENDING)


def test_cited_results_exist():
    missing = []
    for path in checked():
        with open(os.path.join(ROOT, path)) as f:
            text = f.read()
        missing += [(path, c) for c in sorted(result_citations(text))
                    if not exists_anywhere(c, path)]
    assert not missing, missing


def test_cited_bench_scripts_exist():
    missing = []
    for path in checked():
        with open(os.path.join(ROOT, path)) as f:
            text = f.read()
        for m in re.finditer(r"bench/([\w/]+\.(?:py|sh))", text):
            if removed_after(text, m.end()) or m.group(0) in EXPECTED_SCRIPTS:
                continue
            if re.fullmatch(r"[A-Z_]+\.py", m.group(1)):
                continue                   # a placeholder: bench/NAME.py
            if not os.path.exists(os.path.join(ROOT, "bench", m.group(1))):
                missing.append((path, m.group(0)))
    assert not missing, missing


def cites_removed(text):
    return re.search(r"bench/probes|probes/probe_|probe_\w+\.py|bench/(oracle_bound|lsh_block)"
                     r"\.py|block_phases_amazon670k_session7|fork_join_t16", text) is not None


def test_no_doc_or_docstring_cites_the_probes():
    citing = set()
    for path in docs() + tracked("slide/*.py", "tests/*.py", "bench/*.py"):
        if path == "tests/test_docs.py":
            continue                       # this file names them to look for them
        with open(os.path.join(ROOT, path)) as f:
            if re.search(r"bench/probes|probes/probe_|probe_\w+\.py", f.read()):
                citing.add(path)
    assert citing <= PENDING, sorted(citing - PENDING)
    assert not os.path.exists(os.path.join(ROOT, "bench", "probes"))
    assert not os.path.exists(os.path.join(ROOT, "docs", "history.md"))


def test_results_stay_few():
    assert len(subprocess.run(["git", "ls-files", "bench/results"], cwd=ROOT,
                              capture_output=True, text=True).stdout.split()) <= 150


def test_pending_modules_still_need_the_exemption():
    """An exempt module that no longer names a removed probe, study or results file leaves
    PENDING (and the citation checks apply to it again)."""
    clean = []
    for path in sorted(PENDING):
        with open(os.path.join(ROOT, path)) as f:
            if not cites_removed(f.read()):
                clean.append(path)
    assert not clean, f"clean now, remove from PENDING: {clean}"
