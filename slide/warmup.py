"""Kernel compilation apart from training.

Numba compiles a kernel at its first call (or loads it from the on-disk cache, which also takes
seconds), and it specialises on argument *types*, never on sizes. ``warm_up(model)`` therefore
trains a tiny throw-away copy of ``model`` -- the same hyperparameters and code paths (sampler,
hash family, loss, optimizer, depth, sparse layers, dense mode), tiny sizes -- on a tiny
synthetic batch set, with a rehash and a rebuild of its tables, an epoch-end sync and an exact
evaluation, so that every kernel the real run will call is compiled before its clock starts.
It runs once per process and configuration; the seconds it took are what ``SlideClassifier``
reports as ``compile_seconds_``, never as training time.

A cold cache (the first fit after installing or changing slide) compiles for over a minute, one
kernel after another on one core. The stages after the network (the vote, the linear
classifiers, the re-ranker where the fit has one, the exact top-k) do not need a trained
network to compile, so ``warm_up`` then starts a **helper process** that compiles them into
Numba's on-disk cache (``warm_ranking``: the same tiny copy, built but not trained), with the
output layer's row steps (on no rows), while this process compiles the rest of the network's;
this process then loads them from the cache. The helper then compiles any fit the caller says
comes next (``slide train``'s dense baseline), in the time its half leaves it. Only where
their cache is cold, a second core is free, and ``SLIDE_COMPILE_HELPER`` is not ``0``; a helper
that fails costs nothing but its gain (this process compiles what it needs itself).
"""
import contextlib
import gc
import os
import pickle
import subprocess
import sys
import threading
import time
from typing import NamedTuple

import numba
import numpy as np
import scipy.sparse as sp
from numba.core.registry import CPUDispatcher
from threadpoolctl import threadpool_limits

from slide import metrics
from slide.kernels import cache as kernel_cache, threads, topk
from slide.network import block_step
from slide.network.block import NO_FEATURE_ROWS
from slide.network.block_step import first_deltas
from slide.network.inflight import batch_builds
from slide.params import hidden_layer_count
from slide.rank import linear as label_linear
from slide.rank.head import HeadClassifiers
from slide.rank.linear import LabelLinear, OneVsRest, strongest_terms
from slide.rank.candidates import candidate_features


# configurations already warmed in this process: key -> seconds the warm-up took
_WARMED = {}

# the tiny copy's sizes: big enough for every hash family (WTA/DWTA need >= 8 inputs) and to
# give every batch a partial last batch and more than one label per sample
_TINY_FEATURES = 64
_TINY_LABELS = 96
_TINY_POINTS = 40
_TINY_BATCH = 16
_TINY_HIDDEN = 16
_TINY_TABLES = 2


def config_key(model):
    """What decides which kernels (and which type signatures) a fit of ``model`` compiles: the
    code paths, never the sizes, rates or seeds; and which builds of the compiled batch it
    takes (``inflight.batch_builds``: one thread a batch, several, or both)."""
    p = model.get_params(deep=False)
    sparse = p["sparse_layers"]
    builds = batch_builds(p.get("batches_in_flight", 1), threads.threads_for(p.get("n_threads")))
    return (tuple(sorted(builds)), hidden_layer_count(p["hidden_sizes"]), p["sampler"],
            p["hash_family"], p["loss"], p["optimizer"], p["bucket_policy"], p["output_bias_init"],
            bool(p["sampling_correction"]), float(p["negative_power"]) > 0.0,
            _reranks(model),
            int(p["shared_negatives"]) > 0, int(p["min_active"]) > 0, p.get("engine"),
            None if sparse is None else tuple(sorted(int(layer) for layer in sparse)))


def _reranks(model):
    """Whether a fit of ``model`` may fit a re-ranker (it does where its data leaves rows to
    hold out for one: ``linear_kinds``)."""
    return bool(getattr(model, "rerank", False)) and int(getattr(model, "neighbours", 0)) > 0


def is_warm(model, X=None, Y=None):
    """True when ``model``'s configuration was already warmed up in this process (with the
    linear classifiers a fit on (X, Y) trains, ``linear_kinds``)."""
    done = _WARMED.get(config_key(model))
    return done is not None and linear_kinds(model, X, Y) <= done[1]


def linear_kinds(model, X=None, Y=None):
    """The kinds of the re-ranker's linear classifiers (``"ovr"``, ``"hashed"``) a fit of
    ``model`` on (X, Y) may train (``label_linear.fit_classifiers`` chooses by the data's
    sizes): both without the data or when its shape leaves it open, none without a
    re-ranker. Decided without the seeded held-out draw: one-vs-rest is certain when the
    training rows with the most terms afford it, excluded when those with the fewest do not."""
    if not _reranks(model):
        return frozenset()
    if X is None or Y is None or not (sp.issparse(X) and sp.issparse(Y)) \
            or X.shape[0] != Y.shape[0]:
        return frozenset(("ovr", "hashed"))
    n_rows, n_labels = int(X.shape[0]), int(Y.shape[1])
    n_held = model._n_held(n_rows, n_labels)
    if n_held == 0:
        return frozenset()
    terms = np.sort(np.minimum(np.diff(sp.csr_matrix(X).indptr),
                               label_linear.MAX_ROW_TERMS))
    n_fit = n_rows - n_held
    work = n_labels * label_linear.OVR_EPOCHS
    cap = label_linear.ovr_work_cap(getattr(model, "_max_ovr_work", None))

    def affordable(t):
        return float(t) * work <= cap
    if affordable(terms[n_rows - n_fit:].sum()):
        return frozenset(("ovr",))
    if not affordable(terms[:n_fit].sum()):
        return frozenset(("hashed",))
    return frozenset(("ovr", "hashed"))


def tiny_data(seed=0):
    """A tiny synthetic multi-label set in the canonical CSR form (float32 values, int32
    indices), every row with 1 to 4 nonzeros and 1 to 3 labels."""
    rng = np.random.default_rng(seed)
    x_rows, y_rows = [], []
    for _ in range(_TINY_POINTS):
        x_rows.append(np.sort(rng.choice(_TINY_FEATURES, rng.integers(1, 5), replace=False)))
        y_rows.append(np.sort(rng.choice(_TINY_LABELS, rng.integers(1, 4), replace=False)))

    def csr(rows, n_cols):
        indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int32)
        indices = np.concatenate(rows).astype(np.int32)
        data = np.ones(len(indices), np.float32)
        return sp.csr_matrix((data, indices, indptr), shape=(len(rows), n_cols))

    X = csr(x_rows, _TINY_FEATURES)
    X.data = rng.uniform(0.1, 1.0, X.nnz).astype(np.float32)
    return X, csr(y_rows, _TINY_LABELS)


def tiny_copy(model):
    """A throw-away estimator with ``model``'s code paths at tiny sizes; its schedule rehashes
    after the first batch and rebuilds after the second, so both run in the warm-up."""
    p = model.get_params(deep=False)
    hs = (_TINY_HIDDEN,) if isinstance(p["hidden_sizes"], str) else p["hidden_sizes"]
    p.update(hidden_sizes=tuple(min(int(h), _TINY_HIDDEN) for h in hs),
             L=min(int(p["L"]), _TINY_TABLES), batch_size=_TINY_BATCH, epochs=1,
             rehash_period=1, rebuild_period=2, rehash_decay=0.0,
             sampler_budget=min(int(p["sampler_budget"]), 32),
             shared_negatives=min(int(p["shared_negatives"]), 8),
             min_active=min(int(p["min_active"]), 24), random_state=0, verbose=0,
             time_budget=None)
    return type(model)(**p)


def warm_up(model, X=None, Y=None, then=()):
    """Compile (or load from Numba's cache) every kernel a fit of ``model`` (on X, Y when
    given: only the linear classifiers that data selects, ``linear_kinds``) will call, unless
    this process already did for its configuration. Returns the seconds spent here (0.0 when
    already warm). ``model``'s hyperparameters must be valid (``fit`` checks them first).
    ``then``: estimators this process fits next on the same data (the CLI's dense baseline):
    a helper, where one runs, compiles their whole fits into the cache as well, after the
    stages after the network, so that their own warm-ups load them (the helper's half of a
    cold warm-up is the shorter by about the dense baseline's compile)."""
    key = config_key(model)
    kinds = linear_kinds(model, X, Y)
    done = _WARMED.get(key)
    if done is not None and kinds <= done[1]:
        threads.warn_if_not_tbb(numba.get_num_threads())
        return 0.0
    t0 = time.perf_counter()
    # a machine's first run spends most of its first fit here (a minute or more): said, with
    # verbose, so that it does not look like a hang
    announce = getattr(model, "verbose", 0) >= 1
    if announce:
        print("compiling kernels (once a machine; later runs load them from Numba's cache) ...",
              end=" ", flush=True)
    copy = _without_unused_reranker(tiny_copy(model), kinds, X is not None)
    later = [FollowingFit(tiny_copy(m), linear_kinds(m, X, Y), X is not None)
             for m in then if not is_warm(m, X, Y)]
    helper = start_helper(copy, kinds, later)
    try:
        with collecting_rarely():
            _warm_in_process(copy, kinds, X is not None)
    except BaseException:
        finish_helper(helper, 0.0)
        raise
    finish_helper(helper)
    if done is not None:
        kinds = kinds | done[1]
    seconds = time.perf_counter() - t0
    _WARMED[key] = (seconds, kinds)
    if announce:
        print(f"{seconds:.1f} s", flush=True)
    # after the first parallel loops: Numba has chosen its threading layer
    threads.warn_if_not_tbb(numba.get_num_threads())
    return seconds


class FollowingFit(NamedTuple):
    """An estimator this process fits after the one it warms up (``warm_up``'s ``then``), as
    the helper warms it."""
    copy: object             # its ``tiny_copy``
    kinds: frozenset         # the linear classifiers its fit trains (``linear_kinds``)
    with_data: bool          # its kinds were chosen by the data


class HelperJob(NamedTuple):
    """What the helper process compiles (``start_helper``)."""
    copy: object             # the ``tiny_copy`` whose stages after the network it compiles
    kinds: frozenset         # its linear classifiers' kinds
    later: list              # ``FollowingFit``s: the fits it then compiles whole


def _warm_in_process(copy, kinds, with_data):
    """The tiny copy's fit, linear classifiers, split products and evaluation, here."""
    _without_unused_reranker(copy, kinds, with_data)
    X, Y = tiny_data()
    _tiny_rules(copy, kinds)
    copy._fit_core(X, Y, eval_set=None, callback=None, resume=False)
    _warm_batch_builds(copy, X, Y)
    _warm_after_network(copy, X, Y, kinds)


def _without_unused_reranker(copy, kinds, with_data):
    """``copy`` without a re-ranker where the data chose no linear classifier for one (too
    small to hold rows out): none to compile, here or in the helper. Returns ``copy``."""
    if with_data and not kinds:
        copy.set_params(rerank=False)
    return copy


def _warm_batch_builds(copy, X, Y):
    """The builds of the compiled batch that the real fit takes (``batch_builds``) and the
    tiny fit did not: the tiny set's few batches cap its workers (3 workers of 16 threads
    share them, where 16 workers of the real fit take a thread each), and a fit whose first
    batches train with fewer workers (``inflight.warm_workers``) takes two builds. Each missing
    one is taken by a network-only tiny fit: on one thread, or one batch at a time on all."""
    net = copy.network_
    if not (net.sparse.any() and block_step.applies(net)):
        return
    for one_thread in batch_builds(copy.batches_in_flight, copy._threads()):
        kernel = block_step.block_batch_one_thread if one_thread else block_step.block_batch
        if kernel.signatures:
            continue
        layout = {"n_threads": 1} if one_thread else {"batches_in_flight": 1}
        other = type(copy)(**dict(copy.get_params(deep=False), neighbours=0, rerank=False,
                                  **layout))
        other._fit_core(X, Y, eval_set=None, callback=None, resume=False)


def _tiny_rules(copy, kinds):
    """The tiny set's held-out rows fit a re-ranker, and its linear classifiers are of the
    kinds ``kinds`` (the tiny set affords one-vs-rest: without "ovr", it must choose hashed).
    Both are the copy's own settings: nothing another fit reads changes meanwhile."""
    copy._rerank_min_holdout = 1
    if "ovr" not in kinds:
        copy._max_ovr_work = -1


def _warm_after_network(copy, X, Y, kinds):
    """What runs after the network: the linear classifiers' kinds (the re-ranker's fit built
    the rest), the exact top-k's split products and the CLI's evaluation."""
    if copy.rank_.reranker is not None:
        _warm_linear(copy, X, Y, kinds)
    _warm_split_products(copy)
    # the evaluation the CLI runs during training (exact top-k, then P@k / nDCG@k / PSP@k)
    top = copy.predict_topk(X, k=5)
    metrics.evaluate(Y, top, ks=(1, 3, 5),
                     inv_propensity=metrics.inverse_propensity(Y, 0.55, 1.5))


def warm_ranking(copy, kinds):
    """Compile the kernels of the stages after the network (``warm_up``'s helper process runs
    this): ``copy``, a ``tiny_copy``, is built and its stages fitted on the tiny set as its fit
    would, without training its network (the types, not the weights, decide what compiles)."""
    X, Y = tiny_data()
    _tiny_rules(copy, kinds)
    copy._threads()
    hs, sparse = copy._checked_params()
    X, Y, _ = copy._check_training_data(X, Y, False, None)
    copy._build(X.shape[1], Y.shape[1], hs, sparse)
    _warm_output_steps(copy)
    copy._build_memory(X, Y, copy._rerank_split(X.shape[0], Y.shape[1]))
    _warm_after_network(copy, X, Y, kinds)


def _warm_output_steps(copy):
    """The output layer's row steps (the batched engine's: all its row steps in one loop) and
    the optimizer's flush, on no rows: the last network kernels a fit compiles, and the
    largest (the row steps' loop), so the helper takes them first. The touched rows' step
    (``touched_step``) compiles in this process: with a batch's one-thread build that keeps
    the two halves even (docs/design.md, "Compilation apart from training")."""
    net, opt = copy.network_, copy.optimizer_
    if net.row_path:
        net.prepare(int(copy.batch_size), copy._threads(), 1)
        opt.next_step()                     # a step to flush: the flush compiles only then
        if net.block is None:
            opt.step_output(net.W, net.B, net.out_rows, 0, net.store)
        else:
            # the types of a fit's calls (block_step._update), on no rows
            dels, _ = first_deltas(net.block, net.sc.a_off, int(copy.batch_size))
            opt.step_batch_rows(net.W, net.B,
                                (NO_FEATURE_ROWS, 0, np.zeros(0, np.float32), dels),
                                (net.out_rows, 0, net.store),
                                (np.empty(0, np.int32), net.block.dWS[:0], net.block.dbS[:0],
                                 net.out_stamp, 0))
    opt.warm_bias_steps(net.params, net.touched_rows)
    opt.flush(net.W, net.B)


def ranking_cached(copy=None):
    """Whether the helper's half of ``copy``'s warm-up (any re-ranking configuration's, where
    None) is compiled in this process or held by Numba's cache for this source (a stale or
    missing index is cold); unknown counts as cached (no helper). Its probe is a kernel the
    helper compiles and the fit calls last: the re-ranker's features kernel, or without a
    re-ranker the exact top-k's split products."""
    probe = candidate_features if copy is None or _reranks(copy) else topk.logits_into
    return kernel_cache.is_compiled(probe)


def start_helper(copy, kinds, later=()):
    """The helper process compiling the output layer's row steps and the stages after the
    network (``warm_ranking``), then the fits ``later`` (``FollowingFit``s), or None where it
    would not pay or could not run: their cache warm, one core, ``SLIDE_COMPILE_HELPER=0``,
    or a frozen application."""
    if os.environ.get("SLIDE_COMPILE_HELPER", "1") == "0" or _cores() < 2 \
            or ranking_cached(copy) \
            or getattr(sys, "frozen", False):   # a frozen app's executable is not Python
        return None
    env = dict(os.environ)
    # the helper imports this very slide (a checkout on sys.path, not another installation)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
    try:
        proc = subprocess.Popen([sys.executable, "-c", "import slide.warmup as w; w.helper_main()"],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env)
        # the estimators travel unfitted (their class by reference: the same types there)
        proc.stdin.write(pickle.dumps(HelperJob(copy, kinds, list(later))))
        proc.stdin.close()
    except OSError:
        return None
    return proc


def finish_helper(proc, grace=None):
    """Reap the helper: by now it has finished (its half is the shorter); one still running
    after ``grace`` more seconds (default ``HELPER_GRACE_S``) is stopped (Numba writes each
    cache entry whole, so a stopped helper leaves no broken one)."""
    if proc is None:
        return
    try:
        proc.wait(timeout=HELPER_GRACE_S if grace is None else grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


HELPER_GRACE_S = 60.0


def _cores():
    """Cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def helper_main():
    """The helper process: its ``HelperJob`` from stdin, then ``warm_ranking`` and the fits
    that follow."""
    job = pickle.loads(sys.stdin.buffer.read())
    with collecting_rarely():
        warm_ranking(job.copy, job.kinds)
        for fit in job.later:
            _warm_in_process(fit.copy, fit.kinds, fit.with_data)


# Python's cyclic collector while kernels compile: young collections every 20,000 allocations
# instead of 700, and a full one only after 100 of the middle generation's instead of 10. A
# compile keeps millions of objects alive while it runs (Numba's IR, types and caches), and at
# the default thresholds the collector went over them in full again and again: a first fit's
# fitting process spent 5.2-5.5 s in it, 1.5-1.6 s with these, its peak memory a few per cent
# higher (bench/results/first_fit_debtags.md, "The collector set rarer while a warm-up
# compiles"; docs/design.md, "Compilation apart from training"). Where the collector is
# incremental (Python 3.14), the second value slows its scan of the old objects and the third
# is ignored: rarer still.
COMPILE_GC_THRESHOLDS = (20_000, 20, 100)


class _CollectorSetting:
    """The thresholds to give back once the last block inside ``collecting_rarely`` ends: the
    collector's setting is the process's, and blocks may overlap (warm-ups in threads)."""
    lock = threading.Lock()
    blocks = 0               # blocks inside collecting_rarely now
    saved = None             # the thresholds before the first of them


@contextlib.contextmanager
def collecting_rarely():
    """Python's cyclic collector at ``COMPILE_GC_THRESHOLDS`` inside the block (a warm-up's
    compile); the thresholds from before once no such block runs in the process."""
    state = _CollectorSetting
    with state.lock:
        if state.blocks == 0:
            state.saved = gc.get_threshold()
            gc.set_threshold(*COMPILE_GC_THRESHOLDS)
        state.blocks += 1
    try:
        yield
    finally:
        with state.lock:
            state.blocks -= 1
            if state.blocks == 0:
                gc.set_threshold(*state.saved)


def _warm_split_products(model):
    """The exact top-k's products split over threads by rows (``topk.logits_into``): the
    tiny set's blocks are too short to split, a fit's held-out rows and hard negatives are
    not."""
    out = model._output()
    H = np.zeros((2 * topk.MIN_PART_ROWS, out.W.shape[1]), np.float32)
    S = np.empty((H.shape[0], out.W.shape[0]), np.float32)
    with threadpool_limits(1, user_api="blas"):
        topk.logits_into(H, out.W, out.b, S, 2, 1)


def _warm_linear(model, X, Y, kinds=frozenset(("ovr", "hashed"))):
    """The kinds ``kinds`` of the re-ranker's linear classifiers, fitted and scored on the
    tiny set: which one a fit trains depends on the data's sizes
    (``slide.rank.linear.fit_classifiers``, ``linear_kinds``)."""
    strongest_terms(X, 1)           # the cut of long rows (no tiny row is longer than 128)
    rows = np.arange(X.shape[0], dtype=np.int64)
    ptr = np.arange(X.shape[0] + 1, dtype=np.int64)
    counts = np.ones(X.shape[0], np.int64)
    ids = Y.indices[Y.indptr[:-1]].astype(np.int64)         # each row's first label
    F = np.zeros((X.shape[0], 1))
    if "hashed" in kinds:
        H = model.network_.hidden(X)
        LabelLinear.fit(model._output(), H, X, Y, rows).score_into(X, ptr, counts, ids, F, 0)
        # the other source of hard negatives (which one a fit takes depends on its sizes)
        label_linear.neighbour_negatives(H, Y, rows, label_linear.N_NEGATIVES, 2)
        # the head's one-vs-rest classifiers beside the hashed ones (every label a head here,
        # whatever the work bound allows the data)
        labels = np.arange(Y.shape[1], dtype=np.int64)
        HeadClassifiers(labels, OneVsRest.fit(X, Y, rows), Y.shape[1]).score_into(
            X, ptr, counts, ids, F, 0)
    if "ovr" in kinds:
        OneVsRest.fit(X, Y, rows).score_into(X, ptr, counts, ids, F, 0)


def kernel_signatures():
    """``{"module.function": number of compiled type signatures}`` over every Numba dispatcher
    of the loaded ``slide`` modules: a fit that compiles nothing new leaves it unchanged."""
    out = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "slide" or name.startswith("slide.")):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, CPUDispatcher) and value.__module__ == name:
                out[f"{name}.{attr}"] = len(value.signatures)
    return out
