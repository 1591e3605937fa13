"""The ``slide`` command line: ``train``, ``evaluate``, ``predict``, ``generate``, ``plot``.

Every expected failure (bad config, bad data file, bad checkpoint, diverged training, signals)
ends with one clear message on stderr and a documented exit code (see ``docs/cli.md``), never a
traceback. Heavy modules (NumPy kernels, Numba, matplotlib) are imported inside the commands so
that ``slide --help`` and config errors answer immediately.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time

from slide import config as config_mod
from slide.config import ConfigError

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
PROPENSITY_FILE = "inv_propensity.npy"
CHECKPOINT_DIR = "checkpoints"
BASELINE_DIR = "baseline-dense"
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


def _atomic_write_text(path, text):
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _atomic_save_npy(path, array):
    import numpy as np
    tmp = f"{path}.tmp-{os.getpid()}.npy"
    np.save(tmp, array)
    os.replace(tmp, path)


def _fmt_seconds(s):
    if s < 60:
        return f"{s:.1f} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{int(m)} min {s:04.1f} s"
    h, m = divmod(m, 60)
    return f"{int(h)} h {int(m):02d} min"


# ---------------------------------------------------------------------------------------------
# signals: finish the current batch, checkpoint, exit 130 / 143

class StopFlag:
    """Installed for the duration of ``slide train``. The first SIGINT/SIGTERM only sets a flag
    that the per-batch callback reads (a batch is one Numba call, so a Python handler cannot run
    inside it anyway); a second SIGINT aborts at once without a new checkpoint."""

    def __init__(self):
        self.signum = None
        self._old = {}
        # before training starts there is nothing to checkpoint: stop at once (reading or
        # generating a large data set can take minutes)
        self.immediate = True

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. called from a test thread)
                pass
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False

    def _handle(self, signum, frame):
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum
        if self.immediate:
            raise Stopped(f"stopped by {self.name} before training started; nothing trained, "
                          f"no checkpoint written", self.code)
        name = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
        _err(f"\n{name} received: finishing the current batch and writing a checkpoint "
             f"(press Ctrl-C again to abort without one)")

    @property
    def code(self):
        return EXIT_SIGINT if self.signum == signal.SIGINT else EXIT_SIGTERM

    @property
    def name(self):
        return "Ctrl-C (SIGINT)" if self.signum == signal.SIGINT else "SIGTERM"


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
        _atomic_write_text(self.path, "".join(k + "\n" for k in keep))

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
# progress output

class Progress:
    """tqdm bar when stdout is a terminal, plain log lines every ``every`` seconds otherwise."""

    def __init__(self, label, total, initial, every, samples0=0):
        self.label = label
        self.total = total
        self.every = every
        self.last_log = time.monotonic()
        self.p1 = None
        self.bar = None
        self.samples0 = samples0
        if sys.stdout.isatty():
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, initial=initial, unit="batch", desc=label,
                                dynamic_ncols=True, leave=True, file=sys.stdout,
                                mininterval=0.2)
            except ImportError:
                self.bar = None

    def update(self, batch, epoch, loss, train_seconds, samples, force=False):
        rate = samples / train_seconds if train_seconds > 0 else 0.0
        p1 = "-" if self.p1 is None else f"{self.p1:.4f}"
        if self.bar is not None:
            # tqdm redraws at most every mininterval, so a batch of a few hundred microseconds
            # does not pay for terminal output
            self.bar.set_postfix_str(f"epoch {epoch} loss {loss:.4f} P@1 {p1} "
                                     f"{rate:,.0f} samples/s", refresh=False)
            self.bar.update(batch - self.bar.n)
            return
        now = time.monotonic()
        if force or now - self.last_log >= self.every:
            self.last_log = now
            pct = f"{100.0 * batch / self.total:5.1f}%" if self.total else ""
            _info(f"[{self.label}] batch {batch}/{self.total} {pct} epoch {epoch} "
                  f"loss {loss:.4f} P@1 {p1} {rate:,.0f} samples/s "
                  f"train {_fmt_seconds(train_seconds)}")

    def write(self, msg):
        if self.bar is not None:
            self.bar.write(msg)
        else:
            _info(msg)

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


# ---------------------------------------------------------------------------------------------
# data

def _load_training_data(cfg, run_dir, stop):
    """``(X_train, Y_train, X_eval_pool, Y_eval_pool, pool_name)`` for the configuration."""
    from slide import data as data_mod
    d = cfg["data"]
    if d["preset"] is not None:
        from slide import synthetic
        _info(f"generating synthetic set {d['preset']!r} (scale {d['scale']:g}, seed {d['seed']}"
              + "".join(f", {k}={v}" for k, v in d["overrides"].items()) + ")")
        try:
            X_tr, Y_tr, X_te, Y_te = synthetic.generate(d["preset"], d["scale"], d["seed"],
                                                        **d["overrides"])
        except ValueError as e:
            raise CliError(f"cannot generate data: {e}", EXIT_USAGE) from None
        if d["save_generated"]:
            out = os.path.join(run_dir, "data")
            if not os.path.isdir(out):
                # written beside, then renamed: an interrupted write never leaves a partial set
                # that a later --resume would take for complete
                import shutil
                partial = out + ".partial"
                shutil.rmtree(partial, ignore_errors=True)
                synthetic.write_dataset(partial, X_tr, Y_tr, X_te, Y_te)
                os.replace(partial, out)
                _info(f"wrote the generated set to {out}/train.txt and test.txt")
        pool = (X_te, Y_te, "test split") if X_te.shape[0] > 0 else (X_tr, Y_tr, "training set")
        return X_tr, Y_tr, pool[0], pool[1], pool[2]
    _info(f"reading {d['train']}")
    t0 = time.perf_counter()
    X_tr, Y_tr = data_mod.read_xc(d["train"])
    _info(f"  {X_tr.shape[0]:,} points, {X_tr.shape[1]:,} features, {Y_tr.shape[1]:,} labels "
          f"({time.perf_counter() - t0:.1f} s)")
    if stop.signum is not None:
        return None
    if d["test"] is not None:
        _info(f"reading {d['test']}")
        X_te, Y_te = data_mod.read_xc(d["test"])
        if X_te.shape[1] != X_tr.shape[1] or Y_te.shape[1] != Y_tr.shape[1]:
            raise CliError(f"{d['test']}: header says {X_te.shape[1]} features and "
                           f"{Y_te.shape[1]} labels but {d['train']} has {X_tr.shape[1]} and "
                           f"{Y_tr.shape[1]}", EXIT_DATA)
        return X_tr, Y_tr, X_te, Y_te, "test file"
    return X_tr, Y_tr, X_tr, Y_tr, "training file (no data.test given)"


def _eval_sample(X, Y, n, seed):
    """A fixed shuffled sample of ``n`` rows (never the file's label-sorted head)."""
    import numpy as np
    rng = np.random.default_rng([int(seed), 0x5EED_E7A1])
    rows = np.sort(rng.permutation(X.shape[0])[:n])
    return X[rows], Y[rows]


def _predict_topk_chunked(model, X, k, exact, chunk=4096):
    import numpy as np
    parts = []
    for start in range(0, X.shape[0], chunk):
        parts.append(np.asarray(model.predict_topk(X[start:start + chunk], k=k, exact=exact)))
    if not parts:
        return np.zeros((0, k), dtype=np.int64)
    return np.concatenate(parts, axis=0)


def _scores(model, X, Y, inv_prop=None, exact=True):
    from slide import metrics
    topk = _predict_topk_chunked(model, X, max(KS), exact)
    return metrics.evaluate(Y, topk, ks=KS, inv_propensity=inv_prop)


# ---------------------------------------------------------------------------------------------
# train

def _run_dir_has_run(run_dir):
    return any(os.path.exists(os.path.join(run_dir, n))
               for n in (CHECKPOINT_DIR, METRICS_FILE, MODEL_FILE, SUMMARY_FILE))


def _clean_run_dir(run_dir):
    import shutil
    for name in (CHECKPOINT_DIR, BASELINE_DIR, "data"):
        shutil.rmtree(os.path.join(run_dir, name), ignore_errors=True)
    for name in (METRICS_FILE, MODEL_FILE, SUMMARY_FILE, CONFIG_FILE, PROPENSITY_FILE):
        try:
            os.remove(os.path.join(run_dir, name))
        except FileNotFoundError:
            pass


def _load_checkpoint(path):
    """``slide.load`` with every failure turned into ``CheckpointError`` (never half-loaded:
    the estimator validates the whole file before it builds a model)."""
    est = _engine()
    try:
        return est.load(path)
    except est.CheckpointError:
        raise
    except (OSError, ValueError, EOFError, KeyError) as e:
        raise est.CheckpointError(f"{path}: cannot be loaded: {e}") from None


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


class _Phase:
    """One training run into ``run_dir``: the main SLIDE run, or the dense baseline."""

    def __init__(self, cfg, run_dir, phase, sampler_kind, data, inv_prop, stop, resume,
                 announce_fresh=True, resume_hint="slide train --config ... --resume"):
        self.announce_fresh = announce_fresh
        self.resume_hint = resume_hint
        self.cfg = cfg
        self.run_dir = run_dir
        self.phase = phase
        self.label = "slide" if phase == "slide" else "dense"
        self.sampler_kind = sampler_kind
        self.X, self.Y, self.X_eval, self.Y_eval = data
        self.inv_prop = inv_prop
        self.stop = stop
        self.resume = resume
        t = cfg["train"]
        self.eval_every = t["eval_every_batches"]
        self.ckpt_every = t["checkpoint_every_batches"]
        self.ckpts = Checkpoints(run_dir, t["keep_checkpoints"])
        self.log = MetricsLog(os.path.join(run_dir, METRICS_FILE))
        n = self.X.shape[0]
        self.batches_per_epoch = max(1, math.ceil(n / t["batch_size"]))
        self.total_batches = self.batches_per_epoch * t["epochs"]

    # -- state carried in every checkpoint's ``extra`` so a resumed run continues its clocks
    def _extra(self):
        return {"config": config_mod.strip_private(self.cfg), "phase": self.phase,
                "run": {"batch": self.batch, "epoch": self.epoch,
                        "train_seconds": self.train_seconds, "samples": self.samples,
                        "rehashes": self.rehashes, "rebuilds": self.rebuilds,
                        "last_p1": self.last_p1, "finished": self.finished,
                        # the partial averages of the next metrics line, so that a resumed
                        # run logs exactly what an uninterrupted one would
                        "window": [self.win_loss, self.win_active, self.win_batches,
                                   self.win_rehash, self.win_rebuild]}}

    def _evaluate(self, model):
        s = _scores(model, self.X_eval, self.Y_eval, None, exact=True)
        return {f"P@{k}": s[f"P@{k}"] for k in KS}

    def _log_eval(self, model, info_epoch):
        t0 = time.perf_counter()
        p = self._evaluate(model)
        eval_s = time.perf_counter() - t0
        n = max(1, self.win_batches)
        rec = {"batch": self.batch, "epoch": info_epoch, "samples": self.samples,
               "train_seconds": round(self.train_seconds, 4),
               "loss": self.win_loss / n if self.win_batches else None,
               **{k: round(float(v), 6) for k, v in p.items()},
               "active_mean": self.win_active / n if self.win_batches else None,
               "rehashes": self.win_rehash, "rebuilds": self.win_rebuild,
               "rehashes_total": self.rehashes, "rebuilds_total": self.rebuilds,
               "eval_seconds": round(eval_s, 3)}
        self.log.write(rec)
        self.win_loss = self.win_active = 0.0
        self.win_batches = self.win_rehash = self.win_rebuild = 0
        self.last_p1 = float(p["P@1"])
        self.last_eval_batch = self.batch
        return rec

    def _checkpoint(self, model):
        path = self.ckpts.save(model, self.batch, self._extra())
        self.last_ckpt_batch = self.batch
        return path

    def run(self):
        est = _engine()
        os.makedirs(self.run_dir, exist_ok=True)
        self.batch = self.epoch = self.samples = self.rehashes = self.rebuilds = 0
        self.train_seconds = 0.0
        self.last_p1 = None
        self.finished = False
        self.last_eval_batch = self.last_ckpt_batch = -1
        self.win_loss = self.win_active = 0.0
        self.win_batches = self.win_rehash = self.win_rebuild = 0
        resumed = False
        if self.resume and self.ckpts.list():
            batch, path, model = _latest_good_checkpoint(self.ckpts, self.label,
                                                         quarantine=True)
            extra = getattr(model, "extra_", None)
            _check_resume_config(extra, self.cfg, self.phase, path)
            st = extra.get("run", {})
            self.batch = int(st.get("batch", batch))
            self.epoch = int(st.get("epoch", 0))
            self.train_seconds = float(st.get("train_seconds", 0.0))
            self.samples = int(st.get("samples", 0))
            self.rehashes = int(st.get("rehashes", 0))
            self.rebuilds = int(st.get("rebuilds", 0))
            self.last_p1 = st.get("last_p1")
            self.last_ckpt_batch = self.last_eval_batch = self.batch
            win = st.get("window") or [0.0, 0.0, 0, 0, 0]
            (self.win_loss, self.win_active, self.win_batches, self.win_rehash,
             self.win_rebuild) = float(win[0]), float(win[1]), int(win[2]), int(win[3]), \
                int(win[4])
            # operational settings may change on resume (epochs, threads)
            model.set_params(epochs=self.cfg["train"]["epochs"],
                             n_threads=(self.cfg["train"]["threads"] or None))
            self.log.truncate_after(self.batch)
            resumed = True
            _info(f"[{self.label}] resuming from {path} (batch {self.batch}, "
                  f"{_fmt_seconds(self.train_seconds)} of training so far)")
        else:
            if self.resume and self.announce_fresh:
                _info(f"[{self.label}] no checkpoint yet in {self.ckpts.dir}: starting afresh")
            if os.path.exists(self.log.path):
                os.remove(self.log.path)
            model = est.SlideClassifier(**config_mod.estimator_kwargs(self.cfg,
                                                                      self.sampler_kind))
        if self.batch >= self.total_batches:
            self.finished = True

        progress = Progress(self.label, self.total_batches, self.batch,
                            self.cfg["train"]["log_every_seconds"])
        stopped = False
        last_loss = float("nan")

        def callback(m, info):
            nonlocal stopped, last_loss
            # training wall time as the engine measures it: the batches themselves, rehashes and
            # rebuilds included; evaluation, checkpoints, logging and one-off setup (kernel
            # compilation) excluded, so time-to-accuracy curves compare training alone. The
            # engine keeps it in its checkpoints, so a resumed run continues the same clock.
            self.train_seconds = float(info["train_seconds"])
            self.batch = int(info["batch"])
            self.epoch = int(info.get("epoch", 0))
            self.samples = int(info.get("samples", self.samples))
            loss = float(info["loss"])
            last_loss = loss
            self.win_loss += loss
            self.win_batches += 1
            am = info.get("active_mean")
            if am is not None:
                self.win_active += float(am)
            if info.get("rehashed"):
                self.win_rehash += 1
                self.rehashes += 1
            if info.get("rebuilt"):
                self.win_rebuild += 1
                self.rebuilds += 1
            if self.eval_every and self.batch % self.eval_every == 0:
                self._log_eval(m, self.epoch)
            if self.ckpt_every and self.batch % self.ckpt_every == 0:
                self._checkpoint(m)
            progress.p1 = self.last_p1
            progress.update(self.batch, self.epoch, loss, self.train_seconds, self.samples)
            if self.stop.signum is not None:
                stopped = True
            return stopped

        if not self.finished:
            if self.stop.signum is not None:
                raise Stopped(f"stopped by {self.stop.name} before training started; "
                              f"no checkpoint written", self.stop.code)
            if not resumed:
                _info(f"[{self.label}] training {self.total_batches:,} batches "
                      f"({self.cfg['train']['epochs']} epoch(s) of {self.batches_per_epoch:,})"
                      f" into {self.run_dir}")
            self.stop.immediate = False
            try:
                model.fit(self.X, self.Y, callback=callback, resume=resumed)
            except est.DivergenceError as e:
                progress.close()
                good = self.ckpts.list()
                keep = (f"the last good checkpoint is {good[0][1]}" if good
                        else "no checkpoint had been written yet")
                msg = str(e) if str(e).startswith("training diverged") else \
                    f"training diverged: {e}"
                raise CliError(f"[{self.label}] {msg}\n{keep}; start a new run with a lower "
                               f"optimizer.learning_rate (resuming repeats the divergence)",
                               EXIT_DIVERGED) from None
            finally:
                progress.close()
            if stopped:
                if self.last_ckpt_batch != self.batch:
                    self._checkpoint(model)
                path = self.ckpts.path(self.batch)
                raise Stopped(f"[{self.label}] stopped by {self.stop.name} after batch "
                              f"{self.batch}; checkpoint written to {path}\nresume with: "
                              f"{self.resume_hint}", self.stop.code)
            if not math.isfinite(last_loss) and self.batch > 0:
                raise CliError(f"[{self.label}] training diverged: loss {last_loss} at batch "
                               f"{self.batch}", EXIT_DIVERGED)
        self.finished = True
        if self.last_eval_batch != self.batch:
            rec = self._log_eval(model, self.epoch)
        else:
            rec = None
        if self.last_ckpt_batch != self.batch or not os.path.exists(self.ckpts.path(self.batch)):
            self._checkpoint(model)
        model.save(os.path.join(self.run_dir, MODEL_FILE), extra=self._extra())
        p1 = self.last_p1 if rec is None else rec["P@1"]
        result = {"phase": self.phase, "sampler": self.sampler_kind, "batches": self.batch,
                  "epochs": self.cfg["train"]["epochs"], "samples": self.samples,
                  "train_seconds": round(self.train_seconds, 3), "P@1": p1,
                  "rehashes": self.rehashes, "rebuilds": self.rebuilds}
        return model, result


def cmd_train(args):
    cfg = config_mod.load_config(args.config, args.set)   # ConfigError -> exit 2, no data read
    run_dir = cfg["output_dir"]
    if args.resume and args.overwrite:
        raise CliError("--resume and --overwrite exclude each other", EXIT_USAGE)
    if args.resume:
        if not os.path.isdir(run_dir) or not _run_dir_has_run(run_dir):
            raise CliError(f"nothing to resume: {run_dir} holds no run (train without --resume "
                           f"first)", EXIT_CHECKPOINT)
    elif os.path.isdir(run_dir) and _run_dir_has_run(run_dir):
        if not args.overwrite:
            raise CliError(f"{run_dir} already holds a run: continue it with --resume, start "
                           f"over with --overwrite, or choose another directory with "
                           f"--set output_dir=...", EXIT_USAGE)
        _clean_run_dir(run_dir)
    os.makedirs(run_dir, exist_ok=True)
    cfg_path = os.path.join(run_dir, CONFIG_FILE)
    if args.resume and os.path.exists(cfg_path):
        # refuse a changed configuration before reading any data (the checkpoint's own copy
        # is checked again when it is loaded)
        try:
            saved = config_mod.parse_toml_file(cfg_path)
        except ConfigError:
            saved = None
        if saved is not None:
            _check_resume_config({"config": saved}, cfg, None, cfg_path)
    # the resolved configuration, with every default spelled out
    _atomic_write_text(os.path.join(run_dir, CONFIG_FILE),
                       "# resolved configuration written by 'slide train'\n"
                       + config_mod.to_toml(config_mod.strip_private(cfg)))

    with StopFlag() as stop:
        try:
            return _train(cfg, run_dir, args, stop)
        except Stopped as e:
            _err(str(e))
            return e.code
        except KeyboardInterrupt:
            _err("aborted by a second Ctrl-C; the last checkpoint on disk is kept")
            return EXIT_SIGINT


def _train(cfg, run_dir, args, stop):
    import numpy as np
    from slide import metrics
    loaded = _load_training_data(cfg, run_dir, stop)
    if loaded is None or stop.signum is not None:
        raise Stopped(f"stopped by {stop.name} while reading data; nothing trained",
                      stop.code)
    X_tr, Y_tr, X_pool, Y_pool, pool_name = loaded
    n_eval = min(cfg["data"]["eval_points"], X_pool.shape[0])
    X_ev, Y_ev = _eval_sample(X_pool, Y_pool, n_eval, cfg["train"]["seed"])
    _info(f"evaluation sample: {n_eval:,} points of the {pool_name}")
    # inverse propensities of the *training* labels, kept for 'slide evaluate' (PSP@k)
    inv_prop = metrics.inverse_propensity(Y_tr, cfg["data"]["propensity_a"],
                                          cfg["data"]["propensity_b"])
    _atomic_save_npy(os.path.join(run_dir, PROPENSITY_FILE),
                     np.asarray(inv_prop, dtype=np.float32))

    data = (X_tr, Y_tr, X_ev, Y_ev)
    import shlex
    hint = shlex.join(["slide", "train", "--config", args.config]
                      + [a for kv in args.set for a in ("--set", kv)] + ["--resume"])
    phases = [("slide", cfg["sampler"]["kind"], run_dir)]
    if cfg["train"]["baseline"] == "dense" and cfg["sampler"]["kind"] != "dense":
        phases.append(("dense-baseline", "dense", os.path.join(run_dir, BASELINE_DIR)))
    results = {}
    for phase, kind, pdir in phases:
        resume = args.resume or phase != "slide"
        model, res = _Phase(cfg, pdir, phase, kind, data, inv_prop, stop, resume,
                            announce_fresh=args.resume, resume_hint=hint).run()
        results[phase] = res
        del model

    summary = {"config": os.path.join(run_dir, CONFIG_FILE),
               "eval_points": n_eval, "eval_source": pool_name, **results}
    s, b = results.get("slide"), results.get("dense-baseline")
    if s and b and s["train_seconds"] > 0:
        summary["speedup_vs_dense"] = round(b["train_seconds"] / s["train_seconds"], 3)
        # time to accuracy: where the dense baseline stood after as much training time as the
        # whole SLIDE run took (its last evaluation within that time)
        dense_log = read_metrics(os.path.join(run_dir, BASELINE_DIR, METRICS_FILE))
        within = [r for r in dense_log if r["train_seconds"] <= s["train_seconds"]]
        summary["dense_P@1_at_slide_time"] = within[-1]["P@1"] if within else None
    _atomic_write_text(os.path.join(run_dir, SUMMARY_FILE), json.dumps(summary, indent=2) + "\n")

    _info("")
    _info(f"P@1 on {n_eval:,} held-out points ({pool_name}), training wall time:")
    for phase in results:
        r = results[phase]
        if phase != "slide":
            name = "dense baseline (full softmax)"
        elif r["sampler"] == "dense":
            name = "dense (full softmax)"
        else:
            name = f"slide ({r['sampler']} LSH sampler)" if r["sampler"] != "random" \
                else "sampled softmax (random)"
        _info(f"  {name:32s} P@1 {r['P@1']:.4f}   {_fmt_seconds(r['train_seconds'])}"
              f"   ({r['batches']:,} batches)")
    if "speedup_vs_dense" in summary:
        _info(f"  slide trained {summary['speedup_vs_dense']:.2f}x faster than the dense "
              f"baseline (same network, same epochs)")
        at = summary["dense_P@1_at_slide_time"]
        at = "no evaluation yet" if at is None else f"P@1 {at:.4f}"
        _info(f"  after {_fmt_seconds(s['train_seconds'])} of training (slide's whole run) the "
              f"dense baseline was at {at}")
    _info(f"run directory: {run_dir}  (model: {MODEL_FILE}, metrics: {METRICS_FILE}, "
          f"summary: {SUMMARY_FILE})")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# model loading for evaluate / predict

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
        raise CliError(f"{spec} holds neither {MODEL_FILE} nor checkpoints", EXIT_CHECKPOINT)
    if not os.path.exists(spec):
        raise CliError(f"model not found: {spec}", EXIT_CHECKPOINT)
    model = _load_checkpoint(spec)
    parent = os.path.dirname(os.path.abspath(spec))
    if os.path.basename(parent) == CHECKPOINT_DIR:
        parent = os.path.dirname(parent)
    del est
    return model, spec, parent


def _model_dims(model):
    n_features = getattr(model, "n_features_in_", None)
    n_labels = getattr(model, "n_labels_", None) or getattr(model, "n_outputs_", None)
    return n_features, n_labels


def _conform(X, n_features, path):
    """Give ``X`` the model's feature count (a file's header may be narrower or wider; columns
    beyond the model's are an error, never silently dropped)."""
    if n_features is None or X.shape[1] == n_features:
        return X
    if X.shape[1] > n_features and X.nnz and int(X.indices.max()) >= n_features:
        raise CliError(f"{path}: feature index {int(X.indices.max())} is outside the model's "
                       f"{n_features} features", EXIT_DATA)
    X = X.tocsr(copy=False)
    X.resize((X.shape[0], n_features))
    return X


def cmd_evaluate(args):
    import numpy as np
    from slide import data as data_mod, metrics
    model, mpath, run_dir = _resolve_model(args.model)
    X, Y = data_mod.read_xc(args.data)
    n_features, n_labels = _model_dims(model)
    X = _conform(X, n_features, args.data)
    if n_labels is not None and Y.shape[1] != n_labels:
        if Y.nnz and int(Y.indices.max()) >= n_labels:
            raise CliError(f"{args.data}: label {int(Y.indices.max())} is outside the model's "
                           f"{n_labels} labels", EXIT_DATA)
        Y = Y.tocsr(copy=False)
        Y.resize((Y.shape[0], n_labels))
    inv, source = None, None
    # the run directory's propensities; a dense baseline's model sits one level below its run
    for d in ([run_dir, os.path.dirname(os.path.abspath(run_dir))] if run_dir else []):
        path = os.path.join(d, PROPENSITY_FILE)
        if os.path.exists(path):
            cand = np.load(path)
            if cand.shape == (Y.shape[1],):
                inv, source = cand, f"training labels ({path})"
                break
    if inv is None:
        inv = metrics.inverse_propensity(Y)
        source = f"labels of {args.data} (no training propensities found beside the model)"
        _err(f"note: PSP@k uses inverse propensities from the {source}")
    t0 = time.perf_counter()
    topk = _predict_topk_chunked(model, X, max(KS), exact=not args.sparse)
    seconds = time.perf_counter() - t0
    res = metrics.evaluate(Y, topk, ks=KS, inv_propensity=inv)
    out = {"model": os.path.abspath(mpath), "data": os.path.abspath(args.data),
           "points": int(X.shape[0]), "inference": "sparse (LSH)" if args.sparse else "exact",
           "propensities": source, "predict_seconds": round(seconds, 3),
           **{k: float(v) for k, v in res.items()}}
    text = json.dumps(out, indent=2)
    if args.out:
        _atomic_write_text(args.out, text + "\n")
    if args.json:
        print(text)
    else:
        _info(f"{out['points']:,} points of {args.data}, {out['inference']} inference "
              f"({seconds:.2f} s)")
        header = "metric " + " ".join(f"{'@' + str(k):>8s}" for k in KS)
        _info(header)
        for name in ("P", "nDCG", "PSP"):
            vals = " ".join(f"{float(res[f'{name}@{k}']):8.4f}" for k in KS)
            _info(f"{name:6s} {vals}")
        if args.out:
            _info(f"wrote {args.out}")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# predict: streams the input in chunks of lines

def _read_xc_header(path, f):
    from slide.data import DataFormatError
    raw = f.readline()
    text = raw.decode("utf-8", errors="replace").strip()
    fields = text.split()
    if len(fields) != 3 or not all(x.isdigit() and x.isascii() for x in fields):
        raise DataFormatError(path, 1, text or "<empty>",
                              "header must be 'n_points n_features n_labels'")
    return tuple(int(x) for x in fields)


def _iter_xc_chunks(path, chunk_lines, tmpdir):
    """Yield ``(first_row, X)`` per chunk of at most ``chunk_lines`` data lines, parsed by
    ``slide.data.read_xc`` (one temporary file per chunk, with a header of its own) so only one
    chunk is in memory. Errors report the real file and line."""
    from slide.data import DataFormatError, read_xc
    tmp = os.path.join(tmpdir, "chunk.txt")
    with open(path, "rb") as f:
        n_points, n_features, n_labels = _read_xc_header(path, f)
        row = 0
        line_no = 1
        while True:
            lines = []
            while len(lines) < chunk_lines and row + len(lines) < n_points:
                raw = f.readline()
                if not raw:
                    break
                lines.append(raw if raw.endswith(b"\n") else raw + b"\n")
            if not lines:
                break
            with open(tmp, "wb") as out:
                out.write(f"{len(lines)} {n_features} {n_labels}\n".encode())
                out.writelines(lines)
            try:
                X, _ = read_xc(tmp)
            except DataFormatError as e:
                real = line_no + max(e.line - 1, 1)
                raise DataFormatError(path, real, e.token, e.reason) from None
            yield row, X
            row += len(lines)
            line_no += len(lines)
            if len(lines) < chunk_lines:
                break
        if row < n_points:
            raise DataFormatError(path, line_no + 1, "<end of file>",
                                  f"header announces {n_points} points but the file has {row}")
        for extra in f:
            line_no += 1
            if extra.strip():
                raise DataFormatError(path, line_no, extra.decode(errors="replace").strip()[:40],
                                      f"line beyond the {n_points} points of the header")


def cmd_predict(args):
    import tempfile
    if args.k < 1:
        raise CliError(f"--k must be >= 1, got {args.k}", EXIT_USAGE)
    if args.chunk_size < 1:
        raise CliError(f"--chunk-size must be >= 1, got {args.chunk_size}", EXIT_USAGE)
    if not os.path.isfile(args.data):
        raise CliError(f"data file not found: {args.data}", EXIT_DATA)
    model, mpath, _ = _resolve_model(args.model)
    n_features, _ = _model_dims(model)
    to_stdout = args.out in (None, "-")
    out_path = None if to_stdout else args.out
    tmp_out = None if to_stdout else f"{out_path}.tmp-{os.getpid()}"
    written = 0
    t0 = time.perf_counter()
    out = sys.stdout if to_stdout else open(tmp_out, "w", encoding="utf-8")
    try:
        with tempfile.TemporaryDirectory(prefix="slide-predict-") as tmpdir:
            for _, X in _iter_xc_chunks(args.data, args.chunk_size, tmpdir):
                X = _conform(X, n_features, args.data)
                labels, scores = _topk_with_scores(model, X, args.k, not args.sparse)
                lines = []
                for lab, sc in zip(labels, scores):
                    lines.append(" ".join(f"{int(a)}:{float(b):.6g}" for a, b in zip(lab, sc)
                                          if a >= 0))
                out.write("\n".join(lines) + "\n")
                written += len(lines)
        if not to_stdout:
            out.flush()
            os.fsync(out.fileno())
            out.close()
            os.replace(tmp_out, out_path)
    except BaseException:
        if not to_stdout:
            out.close()
            try:
                os.remove(tmp_out)
            except OSError:
                pass
        raise
    if not to_stdout:
        _err(f"wrote top-{args.k} predictions of {written:,} points to {out_path} "
             f"({time.perf_counter() - t0:.1f} s)")
    return EXIT_OK


def _topk_with_scores(model, X, k, exact):
    """Top-k label ids (the engine's ``predict_topk``) and their output scores for a chunk.
    The engine returns no scores with the top-k, so they are read from ``predict_scores`` on
    slices small enough that the dense score block stays under ~64 MB even at 670K labels."""
    import numpy as np
    labels = np.asarray(model.predict_topk(X, k=k, exact=exact))
    n_labels = max(1, int(getattr(model, "n_labels_", 1)))
    step = max(1, (16 << 20) // n_labels)
    scores = np.empty(labels.shape, dtype=np.float32)
    for a in range(0, X.shape[0], step):
        S = np.asarray(model.predict_scores(X[a:a + step]))
        lab = labels[a:a + step]
        scores[a:a + step] = np.take_along_axis(S, np.where(lab >= 0, lab, 0), axis=1)
    return labels, scores


# ---------------------------------------------------------------------------------------------
# generate, plot

def cmd_generate(args):
    from slide import synthetic
    overrides = {}
    problems = []
    for item in args.set or ():
        key, eq, text = item.partition("=")
        if not eq or not key.strip():
            problems.append(("--set", f"expected key=value, got {item!r}"))
            continue
        overrides[key.strip()] = config_mod.parse_value(text.strip())
    if args.preset not in synthetic.PRESETS:
        problems.append(("--preset", f"unknown preset {args.preset!r}; available: "
                                     f"{', '.join(sorted(synthetic.PRESETS))}"))
    elif not problems:
        try:
            synthetic.preset_params(args.preset, args.scale, **overrides)
        except ValueError as e:
            problems.append(("--set" if overrides else "--scale", str(e)))
    if args.seed < 0:
        problems.append(("--seed", f"must be >= 0, got {args.seed}"))
    if problems:
        raise ConfigError(problems)
    t0 = time.perf_counter()
    X_tr, Y_tr, X_te, Y_te = synthetic.generate(args.preset, args.scale, args.seed, **overrides)
    paths = synthetic.write_dataset(args.out, X_tr, Y_tr, X_te, Y_te)
    _info(f"{args.preset} (scale {args.scale:g}, seed {args.seed}): {X_tr.shape[0]:,} train + "
          f"{X_te.shape[0]:,} test points, {X_tr.shape[1]:,} features, {Y_tr.shape[1]:,} labels"
          f" ({time.perf_counter() - t0:.1f} s)")
    for p in paths:
        _info(f"  wrote {p}")
    return EXIT_OK


def _plot_series(run_dir):
    """``[(label, seconds, p1)]`` for a run directory (and its dense baseline, if any)."""
    series = []
    for sub, suffix in (("", ""), (BASELINE_DIR, " (dense baseline)")):
        d = os.path.join(run_dir, sub) if sub else run_dir
        path = os.path.join(d, METRICS_FILE)
        if not os.path.exists(path):
            if not sub:
                raise CliError(f"{run_dir}: no {METRICS_FILE} (is it a run directory?)",
                               EXIT_USAGE)
            continue
        recs = [r for r in read_metrics(path) if r.get("P@1") is not None]
        if not recs:
            if not sub:
                raise CliError(f"{path}: no evaluations logged yet", EXIT_USAGE)
            continue
        name = os.path.basename(os.path.normpath(run_dir)) + suffix
        if not sub:
            # name the main curve by its sampler (slide's LSH kinds, or a dense run)
            try:
                kind = config_mod.parse_toml_file(os.path.join(d, CONFIG_FILE))["sampler"]["kind"]
                name += " (dense)" if kind == "dense" else f" (slide, {kind} sampler)"
            except (ConfigError, KeyError, TypeError):
                pass
        series.append((name, [0.0] + [r["train_seconds"] for r in recs],
                       [None] + [r["P@1"] for r in recs]))
    return series


def cmd_plot(args):
    series = []
    for d in args.run_dirs:
        series.extend(_plot_series(d))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CliError("'slide plot' needs matplotlib, which is not installed: "
                       "pip install matplotlib (or pip install 'slide[bench]')",
                       EXIT_ERROR) from None
    out = args.out or os.path.join(args.run_dirs[0], "time_to_accuracy.png")
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for name, xs, ys in series:
        pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=name)
    ax.set_xlabel("training wall time (s)")
    ax.set_ylabel("P@1 (evaluation sample)")
    ax.set_title("time to accuracy")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, format="png")
    plt.close(fig)
    _info(f"wrote {out} ({len(series)} curve{'s' if len(series) != 1 else ''})")
    return EXIT_OK


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

    t = sub.add_parser("train", help="train a model from a TOML run configuration",
                       description="Train from a TOML run configuration. Keys:\n"
                                   + config_mod.describe_keys(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--config", "-c", required=True, help="TOML run configuration")
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
    e.add_argument("--data", "-d", required=True, help="XC-format file with true labels")
    e.add_argument("--sparse", action="store_true",
                   help="LSH (sparse) inference instead of exact: the LSH "
                   "candidates plus the 256 highest-bias labels")
    e.add_argument("--json", action="store_true", help="print JSON instead of a table")
    e.add_argument("--out", "-o", help="also write the JSON to this file")
    e.set_defaults(func=cmd_evaluate)

    r = sub.add_parser("predict", help="top-k labels with scores for each line of a file")
    r.add_argument("--model", "-m", required=True, help="run directory or model/checkpoint file")
    r.add_argument("--data", "-d", required=True, help="XC-format file (labels may be empty)")
    r.add_argument("--k", "-k", type=int, default=5, help="labels per point (default 5)")
    r.add_argument("--out", "-o", default="-", help="output file ('-' = stdout, the default)")
    r.add_argument("--sparse", action="store_true", help="LSH (sparse) inference")
    r.add_argument("--chunk-size", type=int, default=10_000,
                   help="lines read and predicted at a time (default 10000)")
    r.set_defaults(func=cmd_predict)

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
    return p


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


if __name__ == "__main__":
    sys.exit(main())
