"""The ``slide`` command line: ``train``, ``evaluate``, ``predict``, ``generate``, ``plot``.

Every expected failure (bad config, bad data file, bad checkpoint, diverged training, signals)
ends with one clear message on stderr and a documented exit code (see ``docs/cli.md``), never a
traceback. Heavy modules (NumPy kernels, Numba, matplotlib) are imported inside the commands so
that ``slide --help`` and config errors answer immediately.

The package: ``main`` (parsing, error handling), ``train``, ``infer`` (evaluate / predict),
``plot`` (plot / generate), ``rundir`` (run-directory I/O), ``progress`` (signals, progress
output), ``common`` (exit codes, file names). Every file is written through
``slide.fileio``.
"""
from slide.cli.common import (EXIT_CHECKPOINT, EXIT_DATA, EXIT_DIVERGED, EXIT_ERROR,  # noqa: F401
                              EXIT_OK, EXIT_SIGINT, EXIT_SIGTERM, EXIT_USAGE, CliError)
from slide.cli.main import build_parser, main  # noqa: F401
