"""The README quotes what the quickstart prints, in the CLI's format, from the log it cites; it
stays a user's page (<= 150 lines, at most 3 commit hashes) whose every cited result file and
local link exists; docs/results.md, which holds the tables and their methods, cites only files
that exist."""
import os
import re

import pytest

from bench.quickstart import figures, printed_block, readme_block, readme_wall_seconds
from slide.cli.train import summary_lines

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
LOG = os.path.join(ROOT, "bench", "results", "quickstart.log")
RESULTS_DOC = os.path.join(ROOT, "docs", "results.md")


def readme():
    with open(README) as f:
        return f.read()


def results_doc():
    with open(RESULTS_DOC) as f:
        return f.read()


def commit_hashes(text):
    """Distinct abbreviated commit hashes (7-40 hex digits, at least one digit and one letter,
    not inside a longer word) anywhere in ``text``, results files' names included."""
    found = re.findall(r"(?<![0-9A-Za-z])[0-9a-f]{7,40}(?![0-9A-Za-z])", text)
    return {h[:7] for h in found if re.search(r"\d", h) and re.search(r"[a-f]", h)}


def skeleton(lines):
    return [figures(line)[0] for line in lines]


def cli_lines():
    """What ``slide train --config configs/quickstart.toml`` prints at the end, made from a
    summary of the quickstart's shape (sampled network, dense baseline, vote + re-ranker)."""
    def phase(name, sampler, seconds, p1, compile_s, post_s, post_p1):
        return {"phase": name, "sampler": sampler, "batches": 141, "epochs": 1,
                "samples": 18000, "train_seconds": seconds, "P@1": p1,
                "post_fit": {"stage": "neighbour vote + re-ranker", "seconds": post_s,
                             "P@1": post_p1},
                "compile_seconds": compile_s, "rehashes": 0, "rebuilds": 0}
    results = {"slide": phase("slide", "random", 1.3, 0.45, 39.6, 10.3, 0.709),
               "dense-baseline": phase("dense-baseline", "dense", 25.7, 0.41, 5.2, 10.8,
                                       0.702)}
    summary = {"speedup_vs_dense": 19.3, "dense_P@1_at_slide_time": None,
               "slide_seconds_to_dense_final_P@1": 1.2,
               "time_to_dense_final_P@1_speedup": 21.9, **results}
    return summary_lines(summary, results, 1000, "test split")


def test_readme_is_a_users_page():
    text = readme()
    assert len(text.splitlines()) <= 150
    assert len(commit_hashes(text)) <= 3, sorted(commit_hashes(text))
    for section in ("## Two commands", "## Python API", "## Command line", "## Results",
                    "## Many cores"):
        assert section in text, section
    assert "python -m pytest -q" in text
    assert "docs/results.md" in text


def test_results_doc_names_machines_not_commits_in_its_prose():
    """docs/results.md cites results files (whose names may carry the commit they ran at) but
    its prose names no commit: a results file records its own."""
    text = results_doc()
    prose = re.sub(r"`[^`]*`", "", text)
    assert not commit_hashes(prose), sorted(commit_hashes(prose))
    assert "AMD EPYC" in text and "Xeon" in text


def test_readme_quotes_the_cli_format():
    # the same lines once every figure is blanked: a change to the CLI's summary must be
    # re-measured and re-quoted
    assert skeleton(readme_block(readme())) == skeleton(cli_lines())


def test_readme_quotes_the_log_it_cites():
    with open(LOG) as f:
        log = f.read()
    text = readme()
    assert readme_block(text) == printed_block(log)
    header = log.splitlines()[0]
    wall = float(re.search(r"whole command ([\d.]+) s wall", header).group(1))
    assert readme_wall_seconds(text) == round(wall)
    commit = re.search(r"fresh clone of commit (\S+)", header).group(1)
    assert not commit.endswith("+dirty")
    assert f"`bench/results/quickstart.log`, commit `{commit[:7]}`" in text
    assert "exit 0" in header


@pytest.mark.parametrize("doc, at_least", [("README.md", 5), ("docs/results.md", 20)])
def test_cited_result_files_and_links_exist(doc, at_least):
    with open(os.path.join(ROOT, doc)) as f:
        text = f.read()
    start = text.index("## Results") if doc == "README.md" else 0
    cited = set(re.findall(r"`([\w./-]+(?:\.md|\.jsonl|\.json|\.log|/))`", text[start:]))
    cited = {c for c in cited if not c.startswith(("docs/", "bench/", "runs/", "tests/"))
             and c not in ("metrics.jsonl", "summary.md")}
    assert len(cited) >= at_least
    for name in cited:
        path = os.path.join(ROOT, "bench", "results", name)
        assert os.path.exists(path), name
    for target in re.findall(r"\]\(([^)#\s]+)\)", text):
        if not target.startswith("http"):
            assert os.path.exists(os.path.join(ROOT, os.path.dirname(doc), target)), target


def _expand_braces(pattern):
    """``a{b,c}d`` -> [``abd``, ``acd``] (every brace group, as a shell expands them)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if m is None:
        return [pattern]
    return [e for alt in m.group(1).split(",")
            for e in _expand_braces(pattern[:m.start()] + alt + pattern[m.end():])]


@pytest.mark.parametrize("doc", ["docs/results.md", "docs/design.md"])
def test_cited_result_patterns_match_files(doc):
    """A citation with a wildcard or a brace group (``roofline_*_rounds_{a,b}.md``) names at
    least one file for each of its brace alternatives."""
    import glob
    with open(os.path.join(ROOT, doc)) as f:
        text = f.read()
    patterns = set(re.findall(r"`([\w./*{},-]*[*{][\w./*{},-]*(?:\.md|\.jsonl|\.log|/))`",
                              text))
    assert patterns
    for pattern in patterns:
        for name in _expand_braces(pattern):
            base = ROOT if name.startswith("bench/") else os.path.join(ROOT, "bench", "results")
            assert glob.glob(os.path.join(base, name)), (pattern, name)


@pytest.mark.parametrize("doc", ["CHANGELOG.md", "docs/results.md", "docs/design.md",
                                 "docs/model.md", "bench/README.md"])
def test_docs_links_exist(doc):
    with open(os.path.join(ROOT, doc)) as f:
        text = f.read()
    for target in re.findall(r"\]\(([^)#\s]+)\)", text):
        if not target.startswith("http"):
            assert os.path.exists(os.path.join(ROOT, os.path.dirname(doc), target)), target
