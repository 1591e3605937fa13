"""Run-directory I/O: checkpoints (rotation, newest good one, resume checks), the metrics
log, and finding the model of a run directory for ``evaluate`` / ``predict``."""
from __future__ import annotations

import json
import os
import shutil

from slide import config as config_mod
from slide.cli.common import (BASELINE_DIR, CHECKPOINT_DIR, CONFIG_FILE, EXIT_CHECKPOINT,
                              MEMBER_DIR, METRICS_FILE, MODEL_FILE, PROPENSITY_FILE, SEARCH_FILE,
                              SUMMARY_FILE, CliError, _engine, _err)
from slide.fileio import write_text


# ---------------------------------------------------------------------------------------------
# run directory, checkpoints, metrics log

class Checkpoints:
    """``DIR/checkpoints/ckpt-<batch>.slide``; the newest ``keep`` are kept. A new checkpoint is
    written (atomically, by the estimator) before older ones are deleted, so a good one always
    exists on disk."""

    def __init__(self, run_dir, keep):
        self.dir = os.path.join(run_dir, CHECKPOINT_DIR)
        self.keep = keep

    def path(self, batch):
        return os.path.join(self.dir, f"ckpt-{batch:09d}.slide")

    def list(self):
        """``[(batch, path)]`` newest first."""
        if not os.path.isdir(self.dir):
            return []
        out = []
        for name in os.listdir(self.dir):
            if name.startswith("ckpt-") and name.endswith(".slide"):
                try:
                    out.append((int(name[5:-6]), os.path.join(self.dir, name)))
                except ValueError:
                    continue
        return sorted(out, reverse=True)

    def save(self, model, batch, extra):
        os.makedirs(self.dir, exist_ok=True)
        path = self.path(batch)
        model.save(path, extra=extra)
        for _, old in self.list()[self.keep:]:
            try:
                if os.path.isdir(old):       # a sharded model's checkpoint directory
                    shutil.rmtree(old)
                else:
                    os.remove(old)
            except OSError:
                pass
        return path


class MetricsLog:
    """``metrics.jsonl``: one JSON object per line, flushed as it goes (``slide plot`` and
    ``tail -f`` read it while training runs)."""

    def __init__(self, path):
        self.path = path

    def truncate_after(self, batch):
        """On resume, drop the lines logged after the checkpoint: they are trained again."""
        if not os.path.exists(self.path):
            return
        keep = []
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line cut by a crash
                if rec.get("batch", 0) <= batch:
                    keep.append(json.dumps(rec))
        write_text(self.path, "".join(k + "\n" for k in keep))

    def write(self, record):
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()


def read_metrics(path):
    records = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except ValueError:
                continue  # tolerate a partially written last line of a running job
    return records


# ---------------------------------------------------------------------------------------------
# train

def member_dirs(run_dir):
    """The member directories an ensemble run has written so far (slide.cli.ensemble)."""
    import re
    if not os.path.isdir(run_dir):
        return []
    pattern = re.compile(MEMBER_DIR.format(r"(\d+)"))
    found = [(int(m.group(1)), name) for name in os.listdir(run_dir)
             if (m := pattern.fullmatch(name))]
    return [os.path.join(run_dir, name) for _, name in sorted(found)]


def _run_dir_has_run(run_dir):
    return bool(member_dirs(run_dir)) or any(
        os.path.exists(os.path.join(run_dir, n))
        for n in (CHECKPOINT_DIR, METRICS_FILE, MODEL_FILE, SUMMARY_FILE))


def _clean_run_dir(run_dir):
    import shutil
    members = [os.path.basename(d) for d in member_dirs(run_dir)]
    for name in (CHECKPOINT_DIR, BASELINE_DIR, "data", *members):
        shutil.rmtree(os.path.join(run_dir, name), ignore_errors=True)
    for name in (METRICS_FILE, MODEL_FILE, SUMMARY_FILE, CONFIG_FILE, PROPENSITY_FILE,
                 SEARCH_FILE, "vectorizer.slide"):     # slide.cli.textdata.VECTORIZER_FILE
        try:
            os.remove(os.path.join(run_dir, name))
        except FileNotFoundError:
            pass


def _load_checkpoint(path):
    """``slide.load`` with every failure turned into ``CheckpointError`` (never half-loaded:
    the estimator validates the whole file before it builds a model)."""
    from slide.persist.checkpoint import CheckpointError
    from slide.persist.models import load
    try:
        return load(path)
    except CheckpointError:
        raise
    except (OSError, ValueError, EOFError, KeyError) as e:
        raise CheckpointError(path, f"cannot be loaded: {e}") from None


def _latest_good_checkpoint(ckpts, label, quarantine=False):
    """The newest checkpoint that loads; corrupt ones are reported and skipped. With
    ``quarantine`` (resuming) a corrupt file is renamed ``*.corrupt``: kept for inspection but
    out of the rotation, so it can never push a good checkpoint out."""
    est = _engine()
    candidates = ckpts.list()
    if not candidates:
        raise CliError(f"[{label}] nothing to resume: no checkpoint in {ckpts.dir}",
                       EXIT_CHECKPOINT)
    for batch, path in candidates:
        try:
            model = _load_checkpoint(path)
        except est.CheckpointError as e:
            moved = ""
            if quarantine:
                try:
                    os.replace(path, path + ".corrupt")
                    moved = f" (renamed to {os.path.basename(path)}.corrupt)"
                except OSError:
                    pass
            _err(f"[{label}] warning: checkpoint {path} is unusable ({e}){moved}; "
                 f"falling back to the previous one")
            continue
        return batch, path, model
    raise CliError(f"[{label}] no usable checkpoint in {ckpts.dir}: all "
                   f"{len(candidates)} are corrupt or truncated", EXIT_CHECKPOINT)


def _check_resume_config(saved_extra, cfg, phase, path):
    if not isinstance(saved_extra, dict) or "config" not in saved_extra:
        raise CliError(f"{path} was not written by 'slide train' (no run configuration in it); "
                       f"cannot resume from it", EXIT_CHECKPOINT)
    if phase is not None and saved_extra.get("phase", phase) != phase:
        raise CliError(f"{path} belongs to the {saved_extra.get('phase')!r} phase, not {phase!r}",
                       EXIT_CHECKPOINT)
    diffs = config_mod.resume_differences(saved_extra["config"], config_mod.strip_private(cfg))
    if diffs:
        lines = "\n".join(f"  {k}: checkpoint has {a!r}, now {b!r}" for k, a, b in diffs)
        raise CliError(f"refusing to resume from {path}: the configuration differs in keys "
                       f"that change what is trained:\n{lines}\n(only train.epochs, output, "
                       f"evaluation, checkpoint, logging and thread settings may change on "
                       f"--resume; start a new run with another output_dir instead)",
                       EXIT_CHECKPOINT)


def _resolve_model(spec):
    """``--model`` may be a run directory (its final model, else its newest good checkpoint) or
    a model/checkpoint file. Returns ``(model, path, run_dir or None)``."""
    est = _engine()
    if os.path.isdir(spec):
        final = os.path.join(spec, MODEL_FILE)
        if os.path.exists(final):
            return _load_checkpoint(final), final, spec
        ck = Checkpoints(spec, 1)
        if ck.list():
            batch, path, model = _latest_good_checkpoint(ck, "model")
            _err(f"note: {spec} has no final {MODEL_FILE} (training unfinished?); using "
                 f"checkpoint {path} (batch {batch})")
            return model, path, spec
        members = member_dirs(spec)
        if members:
            raise CliError(f"{spec} is an ensemble run whose {MODEL_FILE} is not written yet "
                           f"(its members are not all trained: resume it with slide train "
                           f"--resume); a member is a model of its own: --model "
                           f"{members[0]}", EXIT_CHECKPOINT)
        raise CliError(f"{spec} holds neither {MODEL_FILE} nor checkpoints", EXIT_CHECKPOINT)
    if not os.path.exists(spec):
        raise CliError(f"model not found: {spec}", EXIT_CHECKPOINT)
    model = _load_checkpoint(spec)
    parent = os.path.dirname(os.path.abspath(spec))
    if os.path.basename(parent) == CHECKPOINT_DIR:
        parent = os.path.dirname(parent)
    del est
    return model, spec, parent
