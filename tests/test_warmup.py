"""Kernel compilation apart from training (``slide.warmup``): the warm-up compiles every kernel
a fit calls, its seconds go to ``compile_seconds_`` and never to ``train_seconds_``, it runs
once per process and configuration, and the CLI reports it and writes the time-to-accuracy
plot."""
import json
import os
import subprocess
import sys
import time

import numba
import numpy as np
import pytest

import slide
from slide import warmup
from slide.cli import main
from slide.kernels import topk
from slide.rank.candidates import candidate_features

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# neighbours=0: train_seconds_ is then exactly the batches' clock (the vote's memory adds its
# build time after the last batch)
SMALL = dict(neighbours=0, hidden_sizes=(24,), hash_family="simhash", K=4, L=6, range_pow=6,
             bucket_size=32, sampler_budget=40, min_active=50, shared_negatives=30,
             learning_rate=2e-3, batch_size=32, epochs=1, n_threads=1, random_state=0,
             lr_schedule="constant", sampler="vanilla")


@pytest.fixture(scope="module")
def data():
    return slide.generate("tiny", seed=1)


@pytest.fixture
def fresh_process(monkeypatch):
    """As in a new process: no configuration warmed yet (compiled kernels stay compiled)."""
    monkeypatch.setattr(warmup, "_WARMED", {})


def test_warm_up_time_goes_to_compile_seconds_not_training(data, fresh_process, monkeypatch):
    X, Y, _, _ = data
    real_tiny_data = warmup.tiny_data

    def slow_tiny_data(seed=0):
        time.sleep(0.6)            # stands for a slow compilation
        return real_tiny_data(seed)

    monkeypatch.setattr(warmup, "tiny_data", slow_tiny_data)
    seen = []
    model = slide.SlideClassifier(**SMALL).fit(
        X, Y, callback=lambda m, info: seen.append(info["train_seconds"]))
    assert model.compile_seconds_ >= 0.6
    assert model.train_seconds_ < 0.6 and model.train_seconds_ == pytest.approx(seen[-1])
    # the same configuration again in this process: nothing to compile
    again = slide.SlideClassifier(**dict(SMALL, random_state=5, hidden_sizes=(32,))).fit(X, Y)
    assert again.compile_seconds_ == 0.0
    assert again.batches_ == model.batches_
    # another code path (the dense network) warms up on its own
    dense = slide.SlideClassifier(**dict(SMALL, sampler="dense")).fit(X, Y)
    assert dense.compile_seconds_ >= 0.6


def test_config_key_follows_code_paths_not_sizes():
    a = slide.SlideClassifier(**SMALL)
    same_paths = slide.SlideClassifier(**dict(SMALL, hidden_sizes=(512,), L=50, K=2,
                                              batch_size=7, learning_rate=1.0, random_state=9))
    assert warmup.config_key(a) == warmup.config_key(same_paths)
    for change in (dict(sampler="dense"), dict(sampler="topk"), dict(hash_family="dwta", K=2),
                   dict(loss="sigmoid"), dict(optimizer="sgd"), dict(hidden_sizes=(8, 8)),
                   dict(min_active=0), dict(negative_power=0.0), dict(sparse_layers=(0, 1))):
        other = slide.SlideClassifier(**dict(SMALL, **change))
        assert warmup.config_key(other) != warmup.config_key(a), change
    # a batch on one thread takes the batch's one-thread build, on two the parallel one
    if numba.config.NUMBA_NUM_THREADS >= 2:
        keys = [warmup.config_key(slide.SlideClassifier(**dict(SMALL, n_threads=2,
                                                               batches_in_flight=w)))
                for w in (1, 2, "auto")]
        assert keys[0] != keys[1] == keys[2]


def test_tiny_copy_keeps_the_code_paths():
    model = slide.SlideClassifier(**dict(SMALL, hidden_sizes=(300, 200), sampler="topk",
                                         sparse_layers=(1, 2), loss="sigmoid"))
    copy = warmup.tiny_copy(model)
    assert warmup.config_key(copy) == warmup.config_key(model)
    assert copy.hidden_sizes == (16, 16)
    X, Y = warmup.tiny_data()
    assert X.dtype == np.float32 and X.indices.dtype == np.int32 and Y.shape[1] >= 64
    assert np.diff(X.indptr).min() >= 1 and np.diff(Y.indptr).max() >= 2


@pytest.mark.parametrize("change", [{}, dict(sampler="dense"), dict(max_row_labels=3),
                                    dict(loss="softmax_each", sampler="random"),
                                    dict(loss="softmax_each", sampler="dense"),
                                    dict(sampler="topk", hash_family="dwta", K=2, L=4,
                                         loss="sigmoid", optimizer="lazy_adam",
                                         hidden_sizes=(16, 16))])
def test_fit_after_the_warm_up_compiles_nothing(data, fresh_process, change):
    """Numba specialises on types, not sizes: after the tiny warm-up, a real fit (other sizes,
    a partial last batch, evaluation at each epoch end, prediction) adds no signature to any
    kernel of slide. ``max_row_labels=3``: the data's longer rows are cut, the tiny set's
    (at most 3 labels) are not, and the cut labels must keep their index dtypes."""
    X, Y, Xt, Yt = data
    model = slide.SlideClassifier(**dict(SMALL, epochs=2, batch_size=48, **change))
    model._checked_params()
    assert model._warm_up() > 0.0
    before = warmup.kernel_signatures()
    assert sum(before.values()) > 0
    model.fit(X, Y, eval_set=(Xt, Yt))
    model.predict_topk(Xt, k=5)
    assert model.compile_seconds_ == 0.0
    assert warmup.kernel_signatures() == before


# ---------------------------------------------------------------------------------------------
# the command line

TINY_RUN = """
output_dir = "{out}"
[data]
preset = "tiny"
eval_points = 100
[model]
hidden_sizes = [16]
[lsh]
family = "simhash"
K = 4
L = 6
range_pow = 6
[sampler]
budget = 40
min_active = 50
[optimizer]
learning_rate = 2e-3
[train]
epochs = 2
batch_size = 32
threads = 1
eval_every_batches = 6
checkpoint_every_batches = 0
baseline = "dense"
"""


def test_train_reports_compilation_apart_and_writes_the_plot(tmp_path, capsys, fresh_process):
    run = tmp_path / "run"
    cfg = tmp_path / "c.toml"
    cfg.write_text(TINY_RUN.format(out=run))
    assert main(["train", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "[slide] compiling kernels (first run only" in out
    assert "[dense] compiling kernels (first run only" in out
    summary = json.loads((run / "summary.json").read_text())
    for phase in ("slide", "dense-baseline"):
        assert summary[phase]["compile_seconds"] > 0
        assert summary[phase]["train_seconds"] > 0
    assert "per epoch" in out and "dense network's final P@1" in out
    # the networks are compared alone; the vote fitted after each is timed on its own lines
    assert "then, fitted after each network (seconds not counted above), the neighbour vote" \
        in out
    for phase in ("slide", "dense-baseline"):
        assert summary[phase]["post_fit"]["stage"] == "neighbour vote"
        assert summary[phase]["post_fit"]["seconds"] >= 0
    if "slide_seconds_to_dense_final_P@1" in summary:
        assert summary["time_to_dense_final_P@1_speedup"] == pytest.approx(
            summary["dense-baseline"]["train_seconds"]
            / summary["slide_seconds_to_dense_final_P@1"], rel=1e-2)
    png = run / "time_to_accuracy.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a second run in the same process has nothing to compile and says nothing about it
    assert main(["train", "--config", str(cfg), "--set", f"output_dir={tmp_path / 'b'}"]) == 0
    assert "compiling kernels" not in capsys.readouterr().out
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["slide"]["compile_seconds"] == 0.0


def test_config_with_only_data_trains_with_the_api_defaults(tmp_path, capsys, monkeypatch):
    from slide import config as config_mod
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'output_dir = "{tmp_path / "run"}"\n[data]\npreset = "tiny"\n')
    resolved = config_mod.load_config(str(cfg))
    kw = config_mod.estimator_kwargs(resolved)
    defaults = slide.SlideClassifier().get_params(deep=False)
    for name, value in kw.items():
        if name not in ("n_threads", "random_state"):     # train.threads 0 / train.seed
            assert value == defaults[name], name
    fitted = []
    real_fit = slide.SlideClassifier.fit

    def spy(self, *a, **k):
        fitted.append(self.get_params(deep=False))
        return real_fit(self, *a, **k)

    monkeypatch.setattr(slide.SlideClassifier, "fit", spy)
    assert main(["train", "--config", str(cfg)]) == 0
    assert len(fitted) == 1
    for name, value in fitted[0].items():
        if name not in ("n_threads", "random_state"):
            assert value == defaults[name], name
    assert (tmp_path / "run" / "model.slide").exists()


def test_quickstart_config_shows_the_point_of_the_project():
    from slide import config as config_mod
    cfg = config_mod.load_config(os.path.join(ROOT, "configs", "quickstart.toml"),
                                 check_files=False)
    shape = config_mod.synthetic_shape(cfg["data"]["preset"], cfg["data"]["scale"],
                                       cfg["data"]["overrides"])
    assert shape["n_labels"] >= 100_000
    assert cfg["train"]["baseline"] == "dense" and cfg["sampler"]["kind"] != "dense"
    assert cfg["train"]["eval_every_batches"] > 0


# ---------------------------------------------------------------------------------------------
# compiling only what the run uses (issue 30: the quickstart's cold compile)

def test_a_network_without_tables_hands_its_kernels_none():
    # sampler "random": no LSH tables, so the kernels compile without the LSH code
    # (sample.select_active prunes it by the argument's type)
    X, Y, _, _ = slide.generate("tiny", seed=1)
    m = slide.SlideClassifier(**dict(SMALL, sampler="random")).fit(X, Y)
    assert m.network_.tables is None
    lsh = slide.SlideClassifier(**SMALL).fit(X, Y)
    assert lsh.network_.tables is not None


def test_linear_kinds_follow_the_data(monkeypatch):
    from slide.rank import linear as label_linear
    X, Y, _, _ = slide.generate("tiny", seed=1, n_train=3000)
    m = slide.SlideClassifier(**dict(SMALL, neighbours=20))
    assert m.rerank and m._n_held(X.shape[0], Y.shape[1]) > 0
    assert warmup.linear_kinds(m) == {"ovr", "hashed"}             # no data: both
    assert warmup.linear_kinds(m, X, Y) == {"ovr"}                  # tiny labels: affordable
    monkeypatch.setattr(label_linear, "MAX_OVR_WORK", 0)
    assert warmup.linear_kinds(m, X, Y) == {"hashed"}
    assert warmup.linear_kinds(m.set_params(rerank=False), X, Y) == set()
    small = slide.generate("tiny", seed=1, n_train=500)[:2]         # too few rows to hold out
    assert warmup.linear_kinds(m.set_params(rerank=True), *small) == set()


def test_warm_up_with_the_data_compiles_only_the_linear_kind_it_selects(
        fresh_process, monkeypatch):
    from slide.rank import linear as label_linear
    X, Y, _, _ = slide.generate("tiny", seed=1, n_train=3000)
    m = slide.SlideClassifier(**dict(SMALL, neighbours=20, sampler="random"))
    m._validate_params()
    monkeypatch.setattr(label_linear, "MAX_OVR_WORK", 0)
    m._warm_up(X, Y)
    assert warmup.is_warm(m, X, Y) and not warmup.is_warm(m)        # ovr not warmed
    assert label_linear.MAX_OVR_WORK == 0                           # restored after the fit
    # the hashed kind's warm-up compiles the head's one-vs-rest kernels too (a fit with the
    # hashed classifiers trains the head's where the work bound allows)
    before = warmup.kernel_signatures()
    assert before.get("slide.rank.linear.ovr_epoch", 0) > 0
    assert before.get("slide.rank.linear.score_ovr", 0) > 0
    m.fit(X, Y)
    assert isinstance(m.rank_.reranker.linear, label_linear.LabelLinear)
    assert warmup.kernel_signatures() == before


def test_the_classifiers_cap_the_warm_up_lowers_is_the_models_own(fresh_process):
    """The warm-up's tiny fit chooses its linear classifiers through its copy's own cap
    (``_max_ovr_work``), never the module's bound another fit reads meanwhile: a model whose
    cap is lowered trains the hashed classifiers, warmed for them, and one beside it still
    trains one-vs-rest on the same data."""
    from slide.rank import linear as label_linear
    X, Y, _, _ = slide.generate("tiny", seed=1, n_train=3000)
    bound = label_linear.MAX_OVR_WORK
    low = slide.SlideClassifier(**dict(SMALL, neighbours=20, sampler="random"))
    low._max_ovr_work = 0
    assert warmup.linear_kinds(low, X, Y) == {"hashed"}
    copy = warmup.tiny_copy(low)
    warmup._tiny_rules(copy, {"hashed"})
    assert copy._max_ovr_work == -1 and label_linear.MAX_OVR_WORK == bound
    low.fit(X, Y)
    assert isinstance(low.rank_.reranker.linear, label_linear.LabelLinear)
    assert label_linear.MAX_OVR_WORK == bound
    other = slide.SlideClassifier(**dict(SMALL, neighbours=20, sampler="random")).fit(X, Y)
    assert isinstance(other.rank_.reranker.linear, label_linear.OneVsRest)


def test_the_warm_up_compiles_the_exact_top_ks_row_split_products(monkeypatch):
    # a fit's held-out rows and hard negatives split their products over the threads; the
    # tiny set's blocks never do, so the warm-up compiles that kernel itself
    import numba

    from slide.kernels import topk
    monkeypatch.setattr(warmup, "_WARMED", {})
    m = slide.SlideClassifier(**dict(SMALL, neighbours=20, n_threads=2))
    m._checked_params()
    m._warm_up()
    before = warmup.kernel_signatures()
    assert before.get("slide.kernels.topk.logits_into", 0) > 0
    rng = np.random.default_rng(0)
    H = rng.random((2 * topk.MIN_PART_ROWS, 24), dtype=np.float32)
    W = rng.random((300, 24), dtype=np.float32)
    b = np.zeros(300, np.float32)
    threads = numba.get_num_threads()
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    try:
        topk.topk_lse_of_logits(H, W, b, 5)
    finally:
        numba.set_num_threads(threads)
    assert warmup.kernel_signatures() == before


# ---------------------------------------------------------------------------------------------
# the helper process that compiles the stages after the network (a cold cache only)

_SIGNATURES = """
import json, sys
from numba.core.registry import CPUDispatcher
import slide
from slide import warmup
from slide.rank import linear as label_linear   # noqa: F401 (loads the rank modules)


def signatures():
    out = {}
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("slide."):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, CPUDispatcher) and value.__module__ == name:
                out[name + "." + attr] = sorted(str(s) for s in value.signatures)
    return out


rerank = sys.argv[1] == "rerank"
kinds = frozenset(("ovr", "hashed")) if rerank else frozenset()
model = slide.SlideClassifier(rerank=rerank)
warmup.warm_ranking(warmup.tiny_copy(model), kinds)
helper = signatures()
warmup.warm_up(model)
print(json.dumps([helper, signatures()]))
"""

# the stages after the network: what the helper is to compile
_AFTER_NETWORK = ("slide.rank.", "slide.kernels.topk.", "slide.network.infer.", "slide.metrics.",
                  "slide.network.row_steps.batch_row_steps", "slide.network.adam.adam_flush_rows")


@pytest.mark.parametrize("rerank", ["rerank", "no-rerank"])
def test_the_helper_compiles_exactly_what_the_fit_calls_after_the_network(rerank):
    """The helper's kernels, with their argument types, are the ones a fit calls after its
    network, with a re-ranker or without: after them, the whole warm-up adds no signature to
    any kernel of those stages (the fit loads them from the cache the helper wrote), and the
    helper compiled nothing the fit does not call."""
    env = dict(os.environ, SLIDE_COMPILE_HELPER="0")
    out = subprocess.run([sys.executable, "-c", _SIGNATURES, rerank], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    helper, full = json.loads(out.stdout.strip().splitlines()[-1])
    after = {k: v for k, v in full.items() if k.startswith(_AFTER_NETWORK) and v}
    assert ("slide.rank.candidates.candidate_features" in after) == (rerank == "rerank")
    assert "slide.kernels.topk.logits_into" in after
    assert "slide.network.infer.hidden_batch_kernel" in after
    assert "slide.network.row_steps.batch_row_steps" in after
    for name, sigs in after.items():
        assert helper.get(name, []) == sigs, name
    for name, sigs in helper.items():
        assert set(sigs) <= set(full.get(name, [])), name


def test_a_helper_runs_only_where_it_pays(monkeypatch):
    copy = warmup.tiny_copy(slide.SlideClassifier())
    kinds = frozenset(("hashed",))
    monkeypatch.setattr(warmup, "ranking_cached", lambda copy=None: True)
    assert warmup.start_helper(copy, kinds) is None                 # compiled already
    monkeypatch.setattr(warmup, "ranking_cached", lambda copy=None: False)
    monkeypatch.setenv("SLIDE_COMPILE_HELPER", "0")
    assert warmup.start_helper(copy, kinds) is None                 # switched off
    monkeypatch.delenv("SLIDE_COMPILE_HELPER")
    monkeypatch.setattr(warmup, "_cores", lambda: 1)
    assert warmup.start_helper(copy, kinds) is None                 # no second core
    monkeypatch.setattr(warmup, "_cores", lambda: 2)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert warmup.start_helper(copy, kinds) is None                 # a frozen application
    monkeypatch.delattr(sys, "frozen")
    proc = warmup.start_helper(copy, kinds)      # a real helper: the cache is warm, it is quick
    assert proc is not None
    warmup.finish_helper(proc)
    assert proc.returncode == 0


def test_the_helpers_probe_is_a_kernel_its_configuration_compiles(monkeypatch):
    """A configuration without a re-ranker never compiles the re-ranker's features kernel: its
    helper's cache is probed by the exact top-k's split products, which every helper compiles
    (else every later warm-up would start a helper again)."""
    probed = []
    monkeypatch.setattr(warmup.kernel_cache, "is_compiled",
                        lambda kernel: probed.append(kernel) or False)
    for params in ({}, {"rerank": False}, {"neighbours": 0}):
        assert not warmup.ranking_cached(warmup.tiny_copy(slide.SlideClassifier(**params)))
    assert probed == [candidate_features, topk.logits_into, topk.logits_into]


def test_a_fit_too_small_for_a_re_ranker_still_gets_a_helper(monkeypatch, fresh_process):
    """On rows too few to hold out for a re-ranker, the helper compiles the row steps and the
    vote of a copy without one (before, no helper ran and this process compiled them)."""
    started = []
    monkeypatch.setattr(warmup, "start_helper",
                        lambda copy, kinds, later=(): started.append((copy, kinds)))
    monkeypatch.setattr(warmup, "_warm_in_process", lambda *a: None)
    X, Y = warmup.tiny_data()
    model = slide.SlideClassifier()
    assert warmup.linear_kinds(model, X, Y) == frozenset()
    warmup.warm_up(model, X, Y)
    ((copy, kinds),) = started
    assert copy.rerank is False and kinds == frozenset()


def test_a_helper_that_does_not_finish_is_stopped():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    t0 = time.perf_counter()
    warmup.finish_helper(proc, 0.2)
    assert proc.returncode is not None and time.perf_counter() - t0 < 10


def test_the_helper_also_warms_the_fits_that_follow(monkeypatch, fresh_process):
    """``warm_up(model, then=[...])`` hands the helper a tiny copy of each following fit not
    yet warm (the CLI's dense baseline), with its linear classifiers' kinds; the helper warms
    them after the stages after the network."""
    started = []
    monkeypatch.setattr(warmup, "start_helper",
                        lambda copy, kinds, later=(): started.append(list(later)))
    monkeypatch.setattr(warmup, "_warm_in_process", lambda *a: None)
    dense, warm = slide.SlideClassifier(sampler="dense"), slide.SlideClassifier(loss="sigmoid")
    warmup._WARMED[warmup.config_key(warm)] = (1.0, frozenset(("ovr", "hashed")))
    warmup.warm_up(slide.SlideClassifier(), then=[dense, warm])
    (later,) = started
    assert [f.copy.sampler for f in later] == ["dense"]          # the warm one is left out
    assert later[0].copy.hidden_sizes == warmup.tiny_copy(dense).hidden_sizes
    assert later[0].kinds == frozenset(("ovr", "hashed")) and not later[0].with_data

    calls = []
    monkeypatch.setattr(warmup, "warm_ranking", lambda copy, kinds: calls.append(("ranking",)))
    monkeypatch.setattr(warmup, "_warm_in_process",
                        lambda copy, kinds, with_data: calls.append((copy.sampler, kinds)))
    import io
    import pickle
    import types
    job = warmup.HelperJob(slide.SlideClassifier(), frozenset(), [
        later[0]._replace(kinds=frozenset(("hashed",)), with_data=True)])
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(
        buffer=io.BytesIO(pickle.dumps(job))))
    warmup.helper_main()
    assert calls == [("ranking",), ("dense", frozenset(("hashed",)))]


def test_train_hands_the_dense_baseline_to_the_slide_phases_warm_up(tmp_path, monkeypatch,
                                                                    fresh_process):
    """``slide train`` with a dense baseline warms slide's phase with the baseline's fit as
    the one that follows (for the compile helper), and the baseline with nothing after it."""
    calls = []

    def record(model, X=None, Y=None, then=()):
        calls.append((model.sampler, [m.sampler for m in then]))
        return 0.0
    monkeypatch.setattr(warmup, "warm_up", record)
    cfg = tmp_path / "c.toml"
    cfg.write_text(TINY_RUN.format(out=tmp_path / "run"))
    assert main(["train", "--config", str(cfg)]) == 0
    first_sampler, first_then = calls[0]
    assert first_sampler != "dense" and first_then == ["dense"]
    assert all(not then for sampler, then in calls[1:])
    assert any(sampler == "dense" for sampler, _ in calls)


def test_warm_up_takes_every_build_of_the_batch_a_fit_takes():
    """8 in flight on 8 threads: 4 workers of 2 threads for the first quarter (the batch's
    parallel build), then 8 of one (its one-thread build). The warm-up's tiny fit, whose 3
    batches cap its workers at 3 of 2 threads, takes only the first; the warm-up must take
    both, so that the fit compiles nothing inside its training clock. Run in a process of 8
    Numba threads (this one may have 2)."""
    code = (
        "import json, slide\n"
        "from slide import warmup\n"
        "X, Y, _, _ = slide.generate('tiny', seed=1)\n"
        "m = slide.SlideClassifier(random_state=0, n_threads=8, batches_in_flight=8,\n"
        "                          neighbours=0, rerank=False, epochs=1, batch_size=4)\n"
        "m._checked_params()\n"
        "m._warm_up(X, Y)\n"
        "before = warmup.kernel_signatures()\n"
        "m.fit(X, Y)\n"
        "after = warmup.kernel_signatures()\n"
        "print(json.dumps({k: v for k, v in after.items() if v != before.get(k, 0)}))\n")
    env = dict(os.environ, NUMBA_NUM_THREADS="8", SLIDE_COMPILE_HELPER="0")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == {}


def test_verbose_fit_says_when_it_compiles_and_then_not_again(data, fresh_process, capsys):
    """With verbose, a process's first fit of a configuration says that it compiles (a
    machine's first run spends a minute or more there) and how long it took; a second fit of
    the same configuration, warm, says nothing of it; a silent model never does."""
    X, Y, _, _ = data
    slide.SlideClassifier(**dict(SMALL, verbose=1)).fit(X, Y)
    first = capsys.readouterr().out
    assert first.startswith("compiling kernels (once a machine") and first.count("compiling") == 1
    assert first.splitlines()[0].split(" ... ")[1].endswith(" s")
    slide.SlideClassifier(**dict(SMALL, verbose=1, random_state=3)).fit(X, Y)
    assert "compiling" not in capsys.readouterr().out
    warmup._WARMED.clear()
    slide.SlideClassifier(**SMALL).fit(X, Y)
    assert capsys.readouterr().out == ""


def test_the_warm_up_compiles_with_the_collector_set_rarer_and_restores_the_callers(
        monkeypatch, fresh_process):
    """Inside the warm-up's compile (this process's and the helper's) Python's cyclic collector
    runs at ``COMPILE_GC_THRESHOLDS``; after it, also after a failure, at the caller's own."""
    import gc
    seen = []
    monkeypatch.setattr(warmup, "start_helper", lambda copy, kinds, later=(): None)
    monkeypatch.setattr(warmup, "_warm_in_process",
                        lambda *a: seen.append(gc.get_threshold()))
    before = gc.get_threshold()
    callers = (1234, 7, 9)
    assert warmup.COMPILE_GC_THRESHOLDS != callers
    gc.set_threshold(*callers)
    try:
        warmup.warm_up(slide.SlideClassifier())
        assert seen == [warmup.COMPILE_GC_THRESHOLDS] and gc.get_threshold() == callers

        def fails(*a):
            seen.append(gc.get_threshold())
            raise RuntimeError("a kernel failed to compile")
        monkeypatch.setattr(warmup, "_warm_in_process", fails)
        monkeypatch.setattr(warmup, "_WARMED", {})
        with pytest.raises(RuntimeError, match="failed to compile"):
            warmup.warm_up(slide.SlideClassifier())
        assert seen[-1] == warmup.COMPILE_GC_THRESHOLDS and gc.get_threshold() == callers

        import io
        import pickle
        import types
        monkeypatch.setattr(warmup, "warm_ranking",
                            lambda copy, kinds: seen.append(gc.get_threshold()))
        monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=io.BytesIO(
            pickle.dumps(warmup.HelperJob(slide.SlideClassifier(), frozenset(), [])))))
        warmup.helper_main()
        assert seen[-1] == warmup.COMPILE_GC_THRESHOLDS and gc.get_threshold() == callers
    finally:
        gc.set_threshold(*before)


def test_overlapping_warm_ups_give_the_collectors_thresholds_back_once_the_last_ends():
    """Warm-ups in two threads: their blocks end in either order, and the thresholds from
    before the first come back when the last ends, not before (the setting is the process's)."""
    import gc
    before = gc.get_threshold()
    callers = (1234, 7, 9)
    gc.set_threshold(*callers)
    try:
        first, second = warmup.collecting_rarely(), warmup.collecting_rarely()
        first.__enter__()
        second.__enter__()
        first.__exit__(None, None, None)          # the first to start ends first
        assert gc.get_threshold() == warmup.COMPILE_GC_THRESHOLDS
        second.__exit__(None, None, None)
        assert gc.get_threshold() == callers
        with warmup.collecting_rarely():
            with warmup.collecting_rarely():
                pass
            assert gc.get_threshold() == warmup.COMPILE_GC_THRESHOLDS
        assert gc.get_threshold() == callers
    finally:
        gc.set_threshold(*before)
