"""Shared pieces of the ``slide`` command line: exit codes, run-directory file names, the
expected-failure exceptions and the message helpers."""
from __future__ import annotations

import sys


# exit codes (documented in docs/cli.md)
EXIT_OK = 0
EXIT_ERROR = 1        # anything else: I/O error, missing optional dependency, internal error
EXIT_USAGE = 2        # bad command line or configuration (argparse also uses 2)
EXIT_DATA = 3         # unreadable or malformed data file
EXIT_CHECKPOINT = 4   # corrupt/truncated/mismatched checkpoint, nothing to resume, refused resume
EXIT_DIVERGED = 5     # loss became NaN or inf
EXIT_SIGINT = 130     # stopped by Ctrl-C (checkpoint written)
EXIT_SIGTERM = 143    # stopped by SIGTERM (checkpoint written)

MODEL_FILE = "model.slide"
CONFIG_FILE = "config.toml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
PLOT_FILE = "time_to_accuracy.png"
PROPENSITY_FILE = "inv_propensity.npy"
SEARCH_FILE = "search.json"         # the [search] table's trials and winner
CHECKPOINT_DIR = "checkpoints"
BASELINE_DIR = "baseline-dense"
MEMBER_DIR = "member-{}"            # an ensemble run's member k (slide.cli.ensemble)
KS = (1, 3, 5)


class CliError(Exception):
    """An expected failure: ``message`` goes to stderr, ``code`` is the exit status."""

    def __init__(self, message, code=EXIT_ERROR):
        super().__init__(message)
        self.code = code


class Stopped(Exception):
    """Training stopped by a signal after a checkpoint was written."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------------------------------------
# small helpers

def _err(msg):
    print(msg, file=sys.stderr, flush=True)


def _info(msg):
    print(msg, flush=True)


def _engine():
    """The estimator module (imported lazily: it compiles/loads Numba kernels)."""
    from slide import estimator
    return estimator


def _fmt_seconds(s):
    if s < 60:
        return f"{s:.1f} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{int(m)} min {s:04.1f} s"
    h, m = divmod(m, 60)
    return f"{int(h)} h {int(m):02d} min"


def _has_neighbour_memory(model):
    """Whether ``model`` predicts with the neighbour vote (``slide.rank.vote``)."""
    vote = getattr(model, "_neighbour_vote", None)
    return vote is not None and vote() is not None


def _ranking_missing(model):
    """Whether ``model`` should have the neighbour vote that ``fit`` builds after the network
    (``neighbours`` > 0) and has not got it."""
    rank, neighbours = getattr(model, "rank_", None), getattr(model, "neighbours", 0)
    return neighbours > 0 if rank is None else rank.missing(neighbours)   # None: not built
