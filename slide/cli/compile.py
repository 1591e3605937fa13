"""``slide compile``: fill Numba's kernel cache ahead of a run (``slide.warmup``).

A first run compiles slide's kernels for a minute or more (``slide train`` prints it as
``compiling kernels``); every later run loads them from Numba's on-disk cache in seconds. For
a deployment (an image build, a cluster's shared disk) this command does that compilation
ahead of time, for the configuration a run will train: the same tiny throw-away fit that
``fit`` runs before its clock starts (``warmup.warm_up``), per phase (slide's network and,
with ``baseline = "dense"``, the dense one), and the XC parser a run reads its files with.
No data is read: the re-ranker's linear classifiers of both kinds are compiled (a fit
compiles the one its data's sizes select).
"""
from __future__ import annotations

import functools
import os
import sys
import tempfile
import time

from slide import config as config_mod
from slide.cli.common import EXIT_OK, _engine, _fmt_seconds, _info
from slide.fileio import write_text


def _cache_counts():
    """``(kernels, loaded, compiled)`` over the Numba dispatchers of the loaded ``slide``
    modules: type signatures ready, and how many of them came from the on-disk cache or were
    compiled (Numba's per-dispatcher counters; zeros where they are missing)."""
    from numba.core.registry import CPUDispatcher
    kernels = loaded = compiled = 0
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "slide" or name.startswith("slide.")):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, CPUDispatcher) and value.__module__ == name:
                kernels += len(value.signatures)
                stats = getattr(value, "stats", None)
                loaded += sum(getattr(stats, "cache_hits", {}).values())
                compiled += sum(getattr(stats, "cache_misses", {}).values())
    return kernels, loaded, compiled


def _step(label, warm):
    """Run ``warm()`` and print what it compiled or loaded; returns its seconds."""
    print(f"[{label}] compiling kernels ...", end=" ", flush=True)
    before, t0 = _cache_counts(), time.perf_counter()
    warm()
    seconds = time.perf_counter() - t0
    kernels, loaded, compiled = (a - b for a, b in zip(_cache_counts(), before))
    if kernels == loaded == compiled == 0:
        _info(f"already compiled in this process ({_fmt_seconds(seconds)})")
    else:
        _info(f"{kernels} kernel signatures: {compiled} compiled, {loaded} loaded from the "
              f"cache ({_fmt_seconds(seconds)})")
    return seconds


def _warm_reader():
    """The XC parser's kernels (``slide.data.read_xc``), on a two-line file (which would
    otherwise be read without them: ``slide.data.xc_numpy``)."""
    from slide import data as data_mod
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tiny.txt")
        write_text(path, "2 4 3\n0,2 1:0.5 3:1\n 0:1\n")
        data_mod.read_xc(path, use_kernel=True)


def _cache_place():
    """Where Numba keeps slide's cached kernels: ``NUMBA_CACHE_DIR`` when set, else the
    ``__pycache__`` beside each source, else (sources not writable) the user's cache
    directory."""
    try:
        from slide.kernels.expsum import ordered_sum
        locator = ordered_sum._cache._impl.locator
        kind = type(locator).__name__
        path = locator.get_cache_path()
    except Exception:   # noqa: BLE001 -- Numba's private cache API: describe it in general
        return os.environ.get("NUMBA_CACHE_DIR") or "Numba's cache directories"
    if "InTree" in kind:
        return "the __pycache__ directories beside slide's sources"
    return os.path.dirname(path)


def _phases(cfg):
    """``[(label, sampler kind)]`` a ``slide train`` of ``cfg`` trains."""
    kind = cfg["sampler"]["kind"]
    phases = [("slide", kind)]
    if cfg["train"]["baseline"] == "dense" and kind != "dense":
        phases.append(("dense", "dense"))
    return phases


def cmd_compile(args):
    # ConfigError -> exit 2; no data source needed, no data file read
    cfg = config_mod.load_config(args.config, list(args.set), check_files=False,
                                 require_data=False)
    est = _engine()
    _info(f"compiling the kernels of {args.config or 'the default configuration'} into "
          f"Numba's cache ({_cache_place()})")
    t0 = time.perf_counter()
    if cfg["data"]["preset"] is None and cfg["data"]["format"] == "xc":
        _step("reader", _warm_reader)
    if cfg.get("distributed", {}).get("shards"):
        _info("[slide] distributed.shards is set: the shards compile their kernels in their "
              "own processes at a run's start (later runs load them from the cache); nothing "
              "to compile here")
        phases = []
    else:
        phases = _phases(cfg)
    models = [est.SlideClassifier(**config_mod.estimator_kwargs(cfg, kind))
              for _, kind in phases]
    for i, ((label, _), model) in enumerate(zip(phases, models)):
        model._checked_params()
        # the later phases' fits: on a cold cache the compile helper compiles them beside
        # this phase's (``warmup.warm_up``'s ``then``), and their own steps load them
        _step(label, functools.partial(model._warm_up, then=models[i + 1:]))
    _info(f"done in {_fmt_seconds(time.perf_counter() - t0)}: later runs of this configuration "
          f"load these kernels from the cache")
    return EXIT_OK
