"""Argument parsing and the top-level error handling of the ``slide`` command."""
from __future__ import annotations

import argparse
import os
import sys

from slide import config as config_mod
from slide.cli.common import (EXIT_CHECKPOINT, EXIT_DATA, EXIT_DIVERGED, EXIT_ERROR, EXIT_OK,
                              EXIT_SIGINT, EXIT_USAGE, CliError, _err)
from slide.cli.compile import cmd_compile
from slide.cli.export import cmd_export
from slide.cli.infer import cmd_evaluate, cmd_predict
from slide.cli.info import cmd_info
from slide.cli.plot import cmd_generate, cmd_plot
from slide.cli.train import cmd_train
from slide.config import ConfigError


# ---------------------------------------------------------------------------------------------
# argument parsing and error handling

def build_parser():
    p = argparse.ArgumentParser(
        prog="slide",
        description="Train, evaluate and serve extreme-classification networks with "
                    "LSH-sampled sparse layers (SLIDE) on CPUs.",
        epilog="exit codes: 0 ok, 1 other error, 2 bad usage/config, 3 bad data file, "
               "4 checkpoint problem, 5 diverged, 130 Ctrl-C, 143 SIGTERM (see docs/cli.md)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    t = sub.add_parser("train", help="train a model from data files or a TOML run configuration",
                       description="Train from a TOML run configuration, or from data files "
                                   "alone (slide train --train T --test T: every key at its "
                                   "default). Keys:\n" + config_mod.describe_keys(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--config", "-c", help="TOML run configuration (default: none, every key "
                                          "at its default)")
    t.add_argument("--train", metavar="PATH", help="training file (XC, or raw text: .jsonl / .tsv, "
                   "docs/text.md): data.train")
    t.add_argument("--test", metavar="PATH", help="test file (same format): data.test")
    t.add_argument("--set", "-s", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (dotted, e.g. lsh.K=8, "
                        "data.train=path/train.txt, output_dir=runs/x); repeatable")
    t.add_argument("--resume", action="store_true",
                   help="continue the run in output_dir from its newest good checkpoint")
    t.add_argument("--overwrite", action="store_true",
                   help="delete the run already in output_dir and start over")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("evaluate", help="P@k, nDCG@k, PSP@k of a model on a data file")
    e.add_argument("--model", "-m", required=True, help="run directory or model/checkpoint file")
    e.add_argument("--data", "-d", required=True, help="XC-format file with true labels, or a "
                   ".jsonl / .tsv text file for a model trained on text")
    e.add_argument("--sparse", action="store_true",
                   help="sparse inference instead of exact: the serving index's "
                   "candidates (LSH over the output weights, built on first use) plus the "
                   "2%% highest-bias labels")
    e.add_argument("--json", action="store_true", help="print JSON instead of a table")
    e.add_argument("--out", "-o", help="also write the JSON to this file")
    e.set_defaults(func=cmd_evaluate)

    r = sub.add_parser("predict", help="top-k labels with scores for each line of a file")
    r.add_argument("--model", "-m", required=True, help="run directory or model/checkpoint file")
    r.add_argument("--data", "-d", required=True, help="XC-format file (labels may be empty), or a "
                   ".jsonl / .tsv text file for a model trained on text (writes JSON lines of "
                   "label names and scores)")
    r.add_argument("--k", "-k", type=int, default=5, help="labels per point (default 5)")
    r.add_argument("--out", "-o", default="-", help="output file ('-' = stdout, the default)")
    r.add_argument("--sparse", action="store_true",
                   help="sparse inference (serving index + highest-bias labels)")
    r.add_argument("--chunk-size", type=int, default=10_000,
                   help="lines read and predicted at a time (default 10000)")
    r.set_defaults(func=cmd_predict)

    _add_export_parser(sub)

    g = sub.add_parser("generate", help="write a synthetic XC data set")
    g.add_argument("--preset", required=True, help="synthetic preset, e.g. tiny, amazon670k")
    g.add_argument("--scale", type=float, default=1.0,
                   help="multiplies features, labels and points (default 1)")
    g.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    g.add_argument("--set", "-s", action="append", default=[], metavar="KEY=VALUE",
                   help="override a generator parameter, e.g. n_train=5000; repeatable")
    g.add_argument("--out", "-o", required=True, help="directory for train.txt and test.txt")
    g.set_defaults(func=cmd_generate)

    pl = sub.add_parser("plot", help="time-to-accuracy PNG of one or more runs")
    pl.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    pl.add_argument("--out", "-o", help="PNG path (default RUN_DIR/time_to_accuracy.png)")
    pl.set_defaults(func=cmd_plot)

    _add_compile_parser(sub)

    i = sub.add_parser("info", help="versions, threads, vector width and BLAS kernels: what a "
                                    "run's speed depends on, with advice on slow settings")
    i.add_argument("--json", action="store_true", help="print JSON instead of lines")
    i.set_defaults(func=cmd_info)
    return p


def _add_export_parser(sub):
    """`slide export`'s arguments (`slide.cli.export`)."""
    x = sub.add_parser("export", help="a run's model as one file to predict with: without the "
                                      "optimizer's state, with the vectorizer of a text run")
    x.add_argument("--model", "-m", required=True, help="run directory or model/checkpoint file")
    x.add_argument("--out", "-o", required=True, help="the file to write")
    x.add_argument("--optimizer-state", action="store_true",
                   help="keep the optimizer's moments and step records (a file that can be "
                        "trained on, as large as a checkpoint)")
    x.set_defaults(func=cmd_export)


def _add_compile_parser(sub):
    """`slide compile`'s arguments (`slide.cli.compile`)."""
    c = sub.add_parser("compile", help="compile the kernels a run of a configuration uses into "
                                       "Numba's cache, ahead of the run (for deployments)",
                       description="Compile (or load from Numba's on-disk cache) every kernel a "
                                   "'slide train' of the configuration uses, so that the run "
                                   "itself loads them in seconds. Reads no data; prints what "
                                   "it compiled and how long it took.")
    c.add_argument("--config", "-c", help="TOML run configuration (default: none, every key "
                                          "at its default)")
    c.add_argument("--set", "-s", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (dotted, e.g. sampler.kind=dense); repeatable")
    c.set_defaults(func=cmd_compile)


def _classify(exc):
    """Exit code and message for exceptions of the data and engine modules."""
    data_mod = sys.modules.get("slide.data")
    if data_mod is not None and isinstance(exc, data_mod.DataFormatError):
        return EXIT_DATA, f"bad data file: {exc}"
    est = sys.modules.get("slide.estimator")
    if est is not None:
        if isinstance(exc, getattr(est, "CheckpointError", ())):
            return EXIT_CHECKPOINT, f"bad checkpoint: {exc}"
        if isinstance(exc, getattr(est, "DivergenceError", ())):
            return EXIT_DIVERGED, f"training diverged: {exc}"
    return None


def main(argv=None):
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    prog = f"slide {args.command}"
    try:
        return args.func(args)
    except ConfigError as e:
        _err(f"{prog}: error: {e}")
        return EXIT_USAGE
    except CliError as e:
        _err(f"{prog}: error: {e}")
        return e.code
    except KeyboardInterrupt:
        _err(f"{prog}: interrupted")
        return EXIT_SIGINT
    except BrokenPipeError:
        # 'slide predict ... | head': the reader went away; not an error of ours
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return EXIT_OK
    except FileNotFoundError as e:
        _err(f"{prog}: error: file not found: {e.filename or e}")
        return EXIT_DATA if args.command in ("evaluate", "predict") else EXIT_ERROR
    except MemoryError:
        _err(f"{prog}: error: out of memory (try a smaller data.scale, network or "
             f"lsh.range_pow)")
        return EXIT_ERROR
    except Exception as e:  # noqa: BLE001 - last resort: classify or report briefly
        known = _classify(e)
        if known is not None:
            code, msg = known
            _err(f"{prog}: error: {msg}")
            return code
        if os.environ.get("SLIDE_DEBUG"):
            raise
        _err(f"{prog}: internal error: {type(e).__name__}: {e}\n"
             f"(set SLIDE_DEBUG=1 for a traceback)")
        return EXIT_ERROR
