"""``slide export``: a run's model as one file to predict with. The run's own ``model.slide``
is its last checkpoint, which keeps the optimizer's moments and step records so that training
can go on from it; a model that is only served needs none of that (``save(...,
optimizer_state=False)``, ``slide.persist.checkpoint``), and a model trained on text is
written with its vectorizer, so that the file alone answers raw text in label names. A sharded
model (a directory of shards) is written as the single-process model holding the same weights
(``slide.distributed.convert.to_single``), which predicts as it does."""
from __future__ import annotations

import os

from slide.cli.common import EXIT_OK, EXIT_USAGE, CliError
from slide.cli.rundir import _resolve_model
from slide.cli.textdata import text_parts, with_text_steps


def cmd_export(args):
    model, source, run_dir = _resolve_model(args.model)
    out = args.out
    if os.path.isdir(out):
        raise CliError(f"--out {out} is a directory; give the file to write", EXIT_USAGE)
    if os.path.exists(out) and os.path.samefile(out, source):
        raise CliError(f"--out {out} is the model it reads ({source}); write another file",
                       EXIT_USAGE)
    shards = getattr(model, "n_shards", None)
    if shards is not None:
        # a file holds one process's model: the shards' output rows gathered into it
        from slide.distributed.convert import to_single
        sharded, model = model, to_single(model)
        sharded.close()
    steps, classifier = text_parts(model, run_dir)
    from slide import text as text_mod
    pipelined = steps is not None
    written = with_text_steps(steps, classifier) if pipelined else classifier
    text_mod.save(written, out, extra=getattr(classifier, "extra_", None),
                  optimizer_state=args.optimizer_state)
    state = ("with the optimizer's state: it can be trained on" if args.optimizer_state else
             "without the optimizer's state: it predicts as the source, and cannot be trained on")
    converted = (f"one process's model converted from {shards} shards, " if shards is not None
                 else "")
    print(f"wrote {out}: {_mb(_size(out))} (the source {source}: {_mb(_size(source))}), "
          f"{converted}{'with its vectorizer, ' if pipelined else ''}{state}")
    return EXIT_OK


def _size(path):
    """Bytes of a file, or of the files of a directory (a sharded model's)."""
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def _mb(n_bytes):
    return f"{n_bytes / 1e6:.1f} MB"
