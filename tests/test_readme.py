"""The README quotes what the quickstart prints, in the CLI's format, from the log it cites; it
stays a user's page (<= 250 lines) whose every cited result file and local link exists."""
import os
import re

import pytest

from bench.quickstart import figures, printed_block, readme_block, readme_wall_seconds
from slide.cli.train import summary_lines

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
LOG = os.path.join(ROOT, "bench", "results", "quickstart.log")


def readme():
    with open(README) as f:
        return f.read()


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
    assert len(readme().splitlines()) <= 250


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


def test_cited_result_files_and_links_exist():
    text = readme()
    results = text[text.index("## Results"):]
    cited = set(re.findall(r"`([\w./-]+(?:\.md|\.jsonl|\.log|/))`", results))
    assert len(cited) >= 8
    for name in cited:
        path = os.path.join(ROOT, "bench", "results", name)
        assert os.path.exists(path), name
    for target in re.findall(r"\]\(([^)#\s]+)\)", text):
        if not target.startswith("http"):
            assert os.path.exists(os.path.join(ROOT, target)), target


def _expand_braces(pattern):
    """``a{b,c}d`` -> [``abd``, ``acd``] (every brace group, as a shell expands them)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if m is None:
        return [pattern]
    return [e for alt in m.group(1).split(",")
            for e in _expand_braces(pattern[:m.start()] + alt + pattern[m.end():])]


def test_cited_result_patterns_match_files():
    """A citation with a wildcard or a brace group (``roofline_*_rounds_{a,b}.md``) names at
    least one file for each of its brace alternatives."""
    import glob
    text = readme()
    results = text[text.index("## Results"):]
    patterns = set(re.findall(r"`([\w./*{},-]*[*{][\w./*{},-]*(?:\.md|\.jsonl|\.log|/))`",
                              results))
    assert patterns
    for pattern in patterns:
        for name in _expand_braces(pattern):
            base = ROOT if name.startswith("bench/") else os.path.join(ROOT, "bench", "results")
            assert glob.glob(os.path.join(base, name)), (pattern, name)


@pytest.mark.parametrize("doc", ["docs/history.md", "docs/design.md", "docs/model.md"])
def test_docs_links_exist(doc):
    with open(os.path.join(ROOT, doc)) as f:
        text = f.read()
    for target in re.findall(r"\]\(([^)#\s]+)\)", text):
        if not target.startswith("http"):
            assert os.path.exists(os.path.join(ROOT, os.path.dirname(doc), target)), target
