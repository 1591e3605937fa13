"""``slide train``: the run configuration, data, the SLIDE phase and the dense baseline,
resume, checkpoints, evaluation during training and the summary."""
from __future__ import annotations

import json
import math
import os
import time

from slide import config as config_mod
from slide.cli.common import (BASELINE_DIR, CONFIG_FILE, EXIT_CHECKPOINT, EXIT_DATA, EXIT_DIVERGED,
                              EXIT_OK, EXIT_SIGINT, EXIT_USAGE, KS, METRICS_FILE, MODEL_FILE,
                              PLOT_FILE, PROPENSITY_FILE, SUMMARY_FILE, CliError, Stopped, _engine,
                              _err, _fmt_seconds, _has_neighbour_memory, _info, _ranking_missing)
from slide.cli.infer import _scores
from slide.cli.progress import Progress, StopFlag
from slide.cli.rundir import (Checkpoints, MetricsLog, _check_resume_config, _clean_run_dir,
                              _latest_good_checkpoint, _run_dir_has_run, read_metrics)
from slide.config import ConfigError
from slide.fileio import atomic_link, atomic_write, write_text


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


class _Phase:
    """One training run into ``run_dir``: the main SLIDE run, or the dense baseline."""

    def __init__(self, cfg, run_dir, phase, sampler_kind, data, inv_prop, stop, resume,
                 announce_fresh=True, resume_hint="slide train --config ... --resume",
                 text=None, next_kind=None, label=None):
        self.text = text        # slide.cli.textdata.TextRun of a run on raw text, else None
        self.classes = None if text is None else text.classes     # its label names
        self.announce_fresh = announce_fresh
        self.resume_hint = resume_hint
        self.cfg = cfg
        self.run_dir = run_dir
        self.phase = phase
        self.label = label or ("slide" if phase == "slide" else "dense")
        self.sampler_kind = sampler_kind
        self.next_kind = next_kind      # the sampler of the phase after this one, or None
        self.X, self.Y, self.X_eval, self.Y_eval = data
        self.inv_prop = inv_prop
        self.stop = stop
        self.resume = resume
        t = cfg["train"]
        self.eval_every = t["eval_every_batches"]
        self.ckpt_every = t["checkpoint_every_batches"]
        self.ckpts = Checkpoints(run_dir, t["keep_checkpoints"])
        self.log = MetricsLog(os.path.join(run_dir, METRICS_FILE))
        # epochs and batches: the model's plan (``run``), the re-ranker's held-out rows left out
        self.epochs = self.batches_per_epoch = self.total_batches = None

    # -- state carried in every checkpoint's ``extra`` so a resumed run continues its clocks
    def _extra(self):
        return {"config": config_mod.strip_private(self.cfg), "phase": self.phase,
                "run": {"batch": self.batch, "epoch": self.epoch,
                        "train_seconds": self.train_seconds, "samples": self.samples,
                        "rehashes": self.rehashes, "rebuilds": self.rebuilds,
                        "last_p1": self.last_p1, "finished": self.finished,
                        # the network alone at its last batch (before the vote and re-ranker)
                        "network_seconds": self.network_seconds,
                        "network_p1": self.network_p1,
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
               "eval_seconds": round(eval_s, 3),
               # whether the neighbour vote was in the predictions (only after fit's end)
               "neighbour_vote": _has_neighbour_memory(model)}
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

    def _resume(self):
        """The newest good checkpoint, its run state (clocks, counters, the partial metrics
        window) restored; the metrics log cut back to it."""
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
        self.network_seconds = st.get("network_seconds")
        self.network_p1 = st.get("network_p1")
        self.last_ckpt_batch = self.last_eval_batch = self.batch
        win = st.get("window") or [0.0, 0.0, 0, 0, 0]
        (self.win_loss, self.win_active, self.win_batches, self.win_rehash,
         self.win_rebuild) = float(win[0]), float(win[1]), int(win[2]), int(win[3]), \
            int(win[4])
        # operational settings may change on resume (epochs, threads)
        model.set_params(epochs=self.cfg["train"]["epochs"],
                         n_threads=(self.cfg["train"]["threads"] or None))
        self.log.truncate_after(self.batch)
        _info(f"[{self.label}] resuming from {path} (batch {self.batch}, "
              f"{_fmt_seconds(self.train_seconds)} of training so far)")
        return model

    def _fresh(self, est):
        """A new estimator of the configuration; the metrics log starts empty."""
        if self.resume and self.announce_fresh:
            _info(f"[{self.label}] no checkpoint yet in {self.ckpts.dir}: starting afresh")
        if os.path.exists(self.log.path):
            os.remove(self.log.path)
        kw = config_mod.estimator_kwargs(self.cfg, self.sampler_kind)
        dist = self.cfg.get("distributed", {})
        if dist.get("shards"):
            from slide.distributed import ShardedSlideClassifier
            return ShardedSlideClassifier(n_shards=dist["shards"],
                                          ray_address=dist.get("address"),
                                          pipeline_depth=dist.get("pipeline_depth", 1), **kw)
        return est.SlideClassifier(**kw)

    def run(self):
        est = _engine()
        os.makedirs(self.run_dir, exist_ok=True)
        self.batch = self.epoch = self.samples = self.rehashes = self.rebuilds = 0
        self.train_seconds = self.compile_seconds = 0.0
        self.last_p1 = None
        self.network_seconds = self.network_p1 = None
        self.finished = False
        self.last_eval_batch = self.last_ckpt_batch = -1
        self.win_loss = self.win_active = 0.0
        self.win_batches = self.win_rehash = self.win_rebuild = 0
        if self.resume and self.ckpts.list():
            model, resumed = self._resume(), True
        else:
            model, resumed = self._fresh(est), False
        self.epochs, self.batches_per_epoch = model.planned_batches(*self.Y.shape)
        self.total_batches = self.batches_per_epoch * self.epochs
        # done with its batches and with what fit builds after them (the neighbour vote and
        # re-ranker): a run stopped between the two resumes into fit, which builds them
        if self.batch >= self.total_batches and not _ranking_missing(model):
            self.finished = True

        progress = Progress(self.label, self.total_batches, self.batch,
                            self.cfg["train"]["log_every_seconds"])
        self.stopped = False
        self.last_loss = float("nan")

        def callback(m, info):
            return self._after_batch(m, info, progress)

        if not self.finished:
            if self.stop.signum is not None:
                raise Stopped(f"stopped by {self.stop.name} before training started; "
                              f"no checkpoint written", self.stop.code)
            if not resumed:
                _info(f"[{self.label}] training {self.total_batches:,} batches "
                      f"({self.epochs} epoch(s) of {self.batches_per_epoch:,})"
                      f" into {self.run_dir}")
            self.stop.immediate = False
            start = self.batch          # a resume past the last batch trains none
            self._warm_up(model)
            try:
                model.fit(self.X, self.Y, callback=callback, resume=resumed, classes=self.classes)
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
            if self.stopped:
                if self.last_ckpt_batch != self.batch:
                    self._checkpoint(model)
                path = self.ckpts.path(self.batch)
                raise Stopped(f"[{self.label}] stopped by {self.stop.name} after batch "
                              f"{self.batch}; checkpoint written to {path}\nresume with: "
                              f"{self.resume_hint}", self.stop.code)
            if not math.isfinite(self.last_loss) and self.batch > start:
                raise CliError(f"[{self.label}] training diverged: loss {self.last_loss} at "
                               f"batch {self.batch}", EXIT_DIVERGED)
        return self._finish(model)

    def _after_batch(self, m, info, progress):
        """``fit``'s callback after every batch: the run's counters, evaluation, checkpoint
        and progress line; True (stop) once a signal asked for it."""
        # training wall time as the engine measures it: the batches themselves, rehashes and
        # rebuilds included; evaluation, checkpoints, logging and one-off setup (kernel
        # compilation) excluded, so time-to-accuracy curves compare training alone. The
        # engine keeps it in its checkpoints, so a resumed run continues the same clock.
        self.train_seconds = float(info["train_seconds"])
        self.batch = int(info["batch"])
        # batches this call reports: one, or a wave's with several batches in flight
        n_new = int(info.get("batches", 1))
        self.epoch = int(info.get("epoch", 0))
        self.samples = int(info.get("samples", self.samples))
        loss = float(info["loss"])
        self.last_loss = loss
        self.win_loss += loss * n_new
        self.win_batches += n_new
        am = info.get("active_mean")
        if am is not None:
            self.win_active += float(am) * n_new
        if info.get("rehashed"):
            self.win_rehash += 1
            self.rehashes += 1
        if info.get("rebuilt"):
            self.win_rebuild += 1
            self.rebuilds += 1
        last = self.batch >= self.total_batches
        if (self.eval_every and _crossed(self.batch, n_new, self.eval_every)) or last:
            # the last batch is always evaluated: the network alone, before fit goes on to
            # the neighbour vote and the re-ranker (timed apart, ``_finish``)
            self._log_eval(m, self.epoch)
        if last:
            self.network_seconds, self.network_p1 = self.train_seconds, self.last_p1
        if self.ckpt_every and _crossed(self.batch, n_new, self.ckpt_every):
            self._checkpoint(m)
        progress.p1 = self.last_p1
        progress.update(self.batch, self.epoch, loss, self.train_seconds, self.samples)
        if self.stop.signum is not None:
            self.stopped = True
        return self.stopped

    def _warm_up(self, model):
        """Compile the kernels before the clock starts, visibly (``slide.warmup``); the seconds
        go to the summary, never to the training time."""
        from slide import warmup
        if warmup.is_warm(model, self.X, self.Y):
            return
        print(f"[{self.label}] compiling kernels (first run only; later runs load them from "
              f"Numba's cache) ...", end=" ", flush=True)
        # the next phase's fit: the compile helper, where one runs, compiles it too
        then = [] if self.next_kind is None else [_engine().SlideClassifier(
            **config_mod.estimator_kwargs(self.cfg, self.next_kind))]
        self.compile_seconds = model._warm_up(self.X, self.Y, then=then)
        _info(_fmt_seconds(self.compile_seconds))

    def _finish(self, model):
        """Final evaluation, checkpoint and model file; the phase's result: the network alone
        (``train_seconds``, ``P@1``: its training clock and P@1 at its last batch) and, apart,
        what ``fit`` built after the network (``post_fit``: the neighbour memory and the
        re-ranker, their seconds and the whole model's P@1)."""
        self.finished = True
        # fit ends by building the neighbour memory (slide.rank.vote) and fitting the re-ranker
        # (slide.rank.rerank): the evaluations and checkpoint taken during the last batch
        # predate it
        voted = _has_neighbour_memory(model)
        if self.network_seconds is None:        # stopped early (time_budget) or no batch run
            self.network_seconds = self.train_seconds
            self.network_p1 = self.last_p1 if self.last_eval_batch == self.batch else None
        if self.network_p1 is None and not voted:
            self.network_p1 = self._log_eval(model, self.epoch)["P@1"]
        self.train_seconds = float(getattr(model, "train_seconds_", self.train_seconds))
        post_fit = None
        if voted:
            rec = self._log_eval(model, self.epoch)
            reranked = getattr(getattr(model, "rank_", None), "reranker", None) is not None
            post_fit = {"stage": "neighbour vote + re-ranker" if reranked
                        else "neighbour vote",
                        "seconds": round(max(0.0, self.train_seconds - self.network_seconds), 3),
                        "P@1": rec["P@1"]}
        ckpt = None
        if (voted or self.last_ckpt_batch != self.batch
                or not os.path.exists(self.ckpts.path(self.batch))):
            ckpt = self._checkpoint(model)
        final = os.path.join(self.run_dir, MODEL_FILE)
        # an XC run's model file is the checkpoint just written (the same save of the same
        # model and run state): a second name for that file, not a second write of every
        # weight and moment
        if not (ckpt is not None and self.text is None and os.path.isfile(ckpt)
                and atomic_link(ckpt, final)):
            from slide.cli.textdata import save_final       # with its vectorizer, for text
            save_final(model, final, self.text, self._extra())
        result = {"phase": self.phase, "sampler": self.sampler_kind, "batches": self.batch,
                  "epochs": self.epochs, "samples": self.samples,
                  "train_seconds": round(self.network_seconds, 3), "P@1": self.network_p1,
                  "post_fit": post_fit, "compile_seconds": round(self.compile_seconds, 3),
                  "rehashes": self.rehashes, "rebuilds": self.rebuilds}
        return model, result


def data_overrides(args):
    """``--train`` / ``--test`` as ``--set`` overrides (before the user's own ``--set``, which
    therefore win); the paths as TOML strings, so no path is read as a number or a boolean."""
    return [f"data.{key}={json.dumps(path)}"
            for key, path in (("train", args.train), ("test", args.test)) if path]


def cmd_train(args):
    # ConfigError -> exit 2, no data read
    cfg = config_mod.load_config(args.config, data_overrides(args) + list(args.set))
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
    write_text(os.path.join(run_dir, CONFIG_FILE),
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
    text = None
    if cfg["data"]["format"] != "xc":       # raw text: slide.cli.textdata
        from slide.cli.textdata import load_text_data
        loaded, text = load_text_data(cfg, run_dir, args.resume)
    else:
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
    with atomic_write(os.path.join(run_dir, PROPENSITY_FILE), "wb") as f:
        np.save(f, np.asarray(inv_prop, dtype=np.float32))

    data = (X_tr, Y_tr, X_ev, Y_ev)
    if cfg.get("search"):
        from slide.cli.search import run_search
        cfg = run_search(cfg, run_dir, X_tr, Y_tr, args.resume)
    import shlex
    hint = shlex.join(["slide", "train", "--config", args.config]
                      + [a for kv in args.set for a in ("--set", kv)] + ["--resume"])
    kind = cfg["sampler"]["kind"]
    baseline = cfg["train"]["baseline"] == "dense" and kind != "dense"
    how = dict(announce_fresh=args.resume, resume_hint=hint, text=text)
    if cfg["model"]["n_models"] > 1:        # the members one after another (slide.cli.ensemble)
        from slide.cli.ensemble import train_ensemble

        def run_member(member_cfg, member_dir, phase, label, last):
            # every member resumes what it finds: on a fresh run its directory is empty
            return _Phase(member_cfg, member_dir, phase, kind, data, inv_prop, stop, True,
                          next_kind="dense" if baseline and last else None, label=label,
                          **how).run()
        results, ensemble = train_ensemble(cfg, run_dir, data, run_member, text)
    else:
        model, res = _Phase(cfg, run_dir, "slide", kind, data, inv_prop, stop, args.resume,
                            next_kind="dense" if baseline else None, **how).run()
        results, ensemble = {"slide": res}, None
        del model
    if baseline:
        _, results["dense-baseline"] = _Phase(cfg, os.path.join(run_dir, BASELINE_DIR),
                                              "dense-baseline", "dense", data, inv_prop, stop,
                                              True, **how).run()

    from slide.environment import system_info       # what the speed depended on
    summary = {"config": os.path.join(run_dir, CONFIG_FILE), "eval_points": n_eval,
               "eval_source": pool_name, **results, "environment": system_info()}
    if ensemble is not None:
        summary["ensemble"] = ensemble
    if text is not None:        # raw text: the vectorizer's fit on the training file
        summary["vectorizer_seconds"] = round(text.vectorize_seconds, 3)
    # against the dense network: slide's network, or an ensemble's member 0
    s, b = results.get("slide", results.get("member-0")), results.get("dense-baseline")
    if s and b and s["train_seconds"] > 0:
        summary.update(_versus_dense(run_dir, s, b))
    write_text(os.path.join(run_dir, SUMMARY_FILE), json.dumps(summary, indent=2) + "\n")
    _print_summary(summary, results, n_eval, pool_name)
    _write_plot(run_dir)
    _info(f"run directory: {run_dir}  (model: {MODEL_FILE}, metrics: {METRICS_FILE}, "
          f"summary: {SUMMARY_FILE})")
    return EXIT_OK


def _network_records(path):
    """The evaluations of the network alone in a metrics log (the last one, with the neighbour
    vote and the re-ranker after fit, left out)."""
    return [r for r in read_metrics(path)
            if r.get("P@1") is not None and not r.get("neighbour_vote")]


def _versus_dense(run_dir, s, b):
    """The networks against each other, the same batches: speed-up per epoch, and time to
    accuracy: how soon slide's network reached the dense network's final P@1 (first
    evaluation at or above it, in training seconds), and where the dense network stood after
    as much training time as slide's whole network run took."""
    out = {"speedup_vs_dense": round(b["train_seconds"] / s["train_seconds"], 3)}
    dense_log = _network_records(os.path.join(run_dir, BASELINE_DIR, METRICS_FILE))
    within = [r for r in dense_log if r["train_seconds"] <= s["train_seconds"]]
    out["dense_P@1_at_slide_time"] = within[-1]["P@1"] if within else None
    target = b["P@1"]
    if target is not None:
        own = run_dir if s["phase"] == "slide" else os.path.join(run_dir, s["phase"])
        reached = [r for r in _network_records(os.path.join(own, METRICS_FILE))
                   if r["P@1"] >= target]
        if reached and reached[0]["train_seconds"] > 0:
            t = reached[0]["train_seconds"]
            out["slide_seconds_to_dense_final_P@1"] = t
            out["time_to_dense_final_P@1_speedup"] = round(b["train_seconds"] / t, 3)
    return out


def _network_name(phase, sampler):
    """"slide's network", an ensemble's "member 0" (slide.cli.ensemble), or "dense network"."""
    if phase == "dense-baseline" or sampler == "dense":
        return "dense network"
    return "slide's network" if phase == "slide" else phase.replace("-", " ")


def _phase_name(phase, sampler):
    who = _network_name(phase, sampler)
    if who == "dense network":
        return "dense network (full softmax)"
    if sampler == "random":
        return f"{who} (sampled softmax)"
    return f"{who} ({sampler} LSH sampler)"


def _p1(p):
    return "-" if p is None else f"{p:.4f}"


def summary_lines(summary, results, n_eval, pool_name):
    """The lines ``slide train`` prints at the end (the README quotes them)."""
    lines = [f"P@1 on {n_eval:,} held-out points ({pool_name}); training wall time, kernel "
             f"compilation apart:"]
    for phase, r in results.items():
        compiled = (f", compile {_fmt_seconds(r['compile_seconds'])}"
                    if r.get("compile_seconds") else "")
        lines.append(f"  {_phase_name(phase, r['sampler']):36s} P@1 {_p1(r['P@1'])}  "
                     f"{_fmt_seconds(r['train_seconds']):>9s}   ({r['batches']:,} batches"
                     f"{compiled})")
    if "speedup_vs_dense" in summary:
        phase = "slide" if "slide" in results else "member-0"
        s, b = results[phase], results["dense-baseline"]
        who = _network_name(phase, s["sampler"])
        whole = "slide's whole network" if phase == "slide" else f"{who}'s whole network"
        if "slide_seconds_to_dense_final_P@1" in summary:
            lines.append(
                f"  {who} reached the dense network's final P@1 ({b['P@1']:.3f}) "
                f"after {_fmt_seconds(summary['slide_seconds_to_dense_final_P@1'])}, "
                f"{summary['time_to_dense_final_P@1_speedup']:.1f}x sooner; per epoch "
                f"{summary['speedup_vs_dense']:.1f}x faster")
        else:
            lines.append(f"  {who} did not reach the dense network's final P@1 "
                         f"({_p1(b['P@1'])}); per epoch {summary['speedup_vs_dense']:.1f}x "
                         f"faster")
        at = summary["dense_P@1_at_slide_time"]
        at = "not evaluated yet" if at is None else f"at P@1 {at:.4f}"
        lines.append(f"  after {_fmt_seconds(s['train_seconds'])} of training ({whole}) the "
                     f"dense network was {at}")
    post = [(phase, r["post_fit"]) for phase, r in results.items() if r.get("post_fit")]
    if post:
        stage = post[0][1]["stage"]
        lines.append(f"then, fitted after each network (seconds not counted above), the "
                     f"{stage}:")
        for phase, pf in post:
            on = _network_name(phase, results[phase]["sampler"])
            on = "the dense network" if on == "dense network" else on
            lines.append(f"  {'on ' + on:36s} P@1 {_p1(pf['P@1'])}  "
                         f"{_fmt_seconds(pf['seconds']):>9s}")
    ens = summary.get("ensemble")
    if ens:
        lines.append(f"the ensemble of the {ens['members']} members (their rankings fused; "
                     f"seconds: all of theirs):")
        lines.append(f"  {'ensemble (model.slide)':36s} P@1 {_p1(ens['P@1'])}  "
                     f"{_fmt_seconds(ens['train_seconds']):>9s}")
    return lines


def _print_summary(summary, results, n_eval, pool_name):
    _info("")
    for line in summary_lines(summary, results, n_eval, pool_name):
        _info(line)


def _write_plot(run_dir):
    """The time-to-accuracy PNG of the run (and its baseline) into the run directory."""
    from slide.cli.plot import write_time_to_accuracy
    out = os.path.join(run_dir, PLOT_FILE)
    try:
        write_time_to_accuracy([run_dir], out)
    except CliError as e:       # no evaluation logged (eval_every_batches = 0, ...)
        _info(f"no plot written: {e}")
        return
    _info(f"wrote {out} (P@1 against training seconds)")


def _crossed(batch, n_new, every):
    """Whether the ``n_new`` batches up to ``batch`` passed a multiple of ``every``."""
    return batch // every > (batch - n_new) // every
