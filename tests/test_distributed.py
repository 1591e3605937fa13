"""slide.distributed: the label-sharded output layer (math without Ray, then the Ray backend)."""
import time

import numpy as np
import pytest

import slide
from slide.persist.checkpoint import CheckpointError
from slide.distributed import ShardedSlideClassifier
from slide.distributed.convert import from_single, to_single
from slide.estimator import SlideClassifier

from conftest import FakeClock

# the small LSH settings of tests/test_estimator.py (tiny set: 200 labels, 600 points)
SMALL = dict(hidden_sizes=(128,), sampler="vanilla", K=3, L=10, range_pow=9, bucket_size=32,
             sampler_budget=30, min_active=40, shared_negatives=16, rehash_period=5, rebuild_period=20,
             rehash_decay=0.05, batch_size=32, learning_rate=1e-2, lr_schedule="constant",
             n_threads=1, neighbours=0,    # sharded models have no neighbour vote: nor do the
                                           # single-process models they are compared with
             # a shard's exact head is its own most frequent labels (a share of the head, as
             # of the draws), not the single process's global head: the comparisons with one
             # process pin the draws-only algorithm both run alike
             exact_head=0.0)


def _losses(model, X, Y, infos=None, **fit_kw):
    out = []

    def cb(m, info):
        out.append(info["loss"])
        if infos is not None:
            infos.append(info)

    model.fit(X, Y, callback=cb, **fit_kw)
    return np.array(out)


# ----------------------------------------------------------------------------------------------
# the math, in process
# ----------------------------------------------------------------------------------------------

def test_dense_shards_give_the_full_softmax_gradient():
    """sampler="dense": every shard's rows active; one SGD step of lr 1 from the sharded model
    equals minus the brute-force gradient of the mean full-softmax loss (1/|y| targets)."""
    rng = np.random.default_rng(0)
    import scipy.sparse as sp
    n, F, H, C = 12, 30, 8, 20
    X = sp.random(n, F, density=0.3, random_state=1, format="csr", dtype=np.float32)
    Yd = (rng.random((n, C)) < 0.15).astype(np.float32)
    Yd[0, 3] = 1.0
    Yd[1] = 0.0            # a sample without labels contributes nothing
    Y = sp.csr_matrix(Yd)
    m = ShardedSlideClassifier(n_shards=3, backend="local", hidden_sizes=(H,), sampler="dense",
                               optimizer="sgd", learning_rate=1.0, lr_schedule="constant",
                               output_bias_init="zero", batch_size=n, epochs=1, random_state=4,
                               n_threads=1)
    hs, sparse = m._checked_params()
    m._build(F, C, hs, sparse)
    W0 = m.hidden_.W.reshape(F, H).copy()
    b0 = m.hidden_.B.copy()
    Wo = np.concatenate([sh.net.output_view()[0] for sh in m.backend_.shards]).copy()
    bo = np.concatenate([sh.net.output_view()[1] for sh in m.backend_.shards]).copy()
    loss = _losses(m, X, Y, resume=True)[0]
    # brute force
    Xd = X.toarray().astype(np.float64)
    pre = Xd @ W0 + b0
    h = np.maximum(pre, 0)
    z = h @ Wo.T.astype(np.float64) + bo
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    Yd = Y.toarray()
    ny = Yd.sum(1)
    T = np.divide(Yd, np.maximum(ny, 1)[:, None])
    has = ny > 0
    ref_loss = np.mean(np.where(has, -(T * np.log(p)).sum(1), 0.0))
    dz = np.where(has[:, None], p - T, 0.0) / n
    gWo = dz.T @ h
    gbo = dz.sum(0)
    dh = dz @ Wo * (pre > 0)
    gW0 = Xd.T @ dh
    gb0 = dh.sum(0)
    Wo2 = np.concatenate([sh.net.output_view()[0] for sh in m.backend_.shards])
    bo2 = np.concatenate([sh.net.output_view()[1] for sh in m.backend_.shards])
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    np.testing.assert_allclose(Wo - Wo2, gWo, atol=2e-6)
    np.testing.assert_allclose(bo - bo2, gbo, atol=2e-6)
    np.testing.assert_allclose(W0 - m.hidden_.W.reshape(F, H), gW0, atol=2e-6)
    np.testing.assert_allclose(b0 - m.hidden_.B, gb0, atol=2e-6)
    assert np.abs(gW0).max() > 1e-3 and np.abs(gWo).max() > 1e-3   # not a vacuous check


def test_three_shards_sampled_step_equals_the_single_process_step():
    """One batch of the sampled path (sampler "random", the default's kernels: active-set
    selection, sampling correction, row-path update) with 3 shards against the single-process
    engine on the same active set: min_active = n_labels makes every label active in both
    (each shard pads to all of its rows; the uniform-fill offset log(U / |R|) is then 0), so
    the two compute the same full softmax and one SGD step of lr 1 moves every weight by the
    same gradient, up to the order of float32 sums. Same seed: the same initial weights, the
    log-prior biases (the shards' from their local counts) and the same batch."""
    import scipy.sparse as sp
    rng = np.random.default_rng(5)
    n, F, H, C = 16, 30, 8, 20
    X = sp.random(n, F, density=0.3, random_state=6, format="csr", dtype=np.float32)
    Yd = (rng.random((n, C)) < 0.12).astype(np.float32)
    Yd[np.arange(n), rng.integers(0, C, n)] = 1.0
    Y = sp.csr_matrix(Yd)
    kw = dict(hidden_sizes=(H,), sampler="random", min_active=C, shared_negatives=0,
              optimizer="sgd", learning_rate=1.0, lr_schedule="constant", batch_size=n,
              epochs=1, random_state=7, n_threads=1, neighbours=0)
    single = SlideClassifier(**kw)
    sharded = ShardedSlideClassifier(n_shards=3, backend="local", **kw)
    for m in (single, sharded):
        m._build(F, C, *m._checked_params())
    W0, b0 = single.network_.layout.weight_view(single.network_.W, 0).copy(), \
        single.network_.layout.bias_view(single.network_.B, 0).copy()
    Wo0 = single.network_.output_view()[0].copy()
    Wo0_sh = np.concatenate([sh.net.output_view()[0] for sh in sharded.backend_.shards])
    np.testing.assert_array_equal(Wo0_sh, Wo0)                     # the same start
    np.testing.assert_array_equal(sharded.hidden_.W.reshape(F, H), W0)
    infos = {}
    for name, m in (("single", single), ("sharded", sharded)):
        m.fit(X, Y, resume=True,
              callback=lambda m, info, name=name: infos.setdefault(name, info))
    assert infos["single"]["active_mean"] == C                     # all active: 20 labels
    assert infos["sharded"]["active_mean"] == pytest.approx(C)      # 7 + 7 + 6 rows
    assert infos["sharded"]["loss"] == pytest.approx(infos["single"]["loss"], rel=1e-6)
    Wo1, bo1 = single.network_.output_view()
    Wo1_sh = np.concatenate([sh.net.output_view()[0] for sh in sharded.backend_.shards])
    bo1_sh = np.concatenate([sh.net.output_view()[1] for sh in sharded.backend_.shards])
    W1 = single.network_.layout.weight_view(single.network_.W, 0)
    b1 = single.network_.layout.bias_view(single.network_.B, 0)
    # the steps (minus the gradients), compared to float32 tolerance of their size
    prior = np.log((Yd.sum(axis=0) + 1.0) / (n + C))       # the biases before the step
    for a0, got, ref in ((Wo0, Wo1_sh, Wo1), (prior, bo1_sh, bo1),
                         (W0, sharded.hidden_.W.reshape(F, H), W1),
                         (b0, sharded.hidden_.B, b1)):
        step_ref = ref - a0
        step_got = got - a0
        tol = 1e-5 * np.abs(step_ref).max() + 1e-6
        np.testing.assert_allclose(step_got, step_ref, rtol=0, atol=tol)
        assert np.abs(step_ref).max() > 1e-3                       # the step is not nothing


def test_one_shard_follows_the_single_process_engine(tiny):
    """Same seed, one thread: one shard draws the same active sets, shared negatives and
    initial weights as the single process; only the order of float operations differs (the
    normaliser is combined outside the sample kernel), measured 3e-8 on the loss over two
    epochs; 1e-4 leaves room for compilers, not for a different algorithm (a different draw
    moves the loss by ~1e-2 from the second batch on)."""
    Xtr, Ytr, Xte, Yte = tiny
    single = SlideClassifier(epochs=2, random_state=3, **SMALL)
    ref_infos, infos = [], []
    ref = _losses(single, Xtr, Ytr, ref_infos)
    sh = ShardedSlideClassifier(n_shards=1, backend="local", epochs=2, random_state=3, **SMALL)
    got = _losses(sh, Xtr, Ytr, infos)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4)
    # the same active sets (sizes), the same rehash/rebuild batches, the same positions
    for key in ("active_mean", "rehashed", "rebuilt", "batch_in_epoch", "epoch", "samples"):
        assert [i[key] for i in infos] == [i[key] for i in ref_infos], key
    assert any(i["rebuilt"] for i in infos) and any(i["rehashed"] for i in infos)
    np.testing.assert_array_equal(sh.predict_topk(Xte, 5), single.predict_topk(Xte, 5))


@pytest.fixture(scope="module")
def three_shards(tiny):
    Xtr, Ytr, Xte, Yte = tiny
    m = ShardedSlideClassifier(n_shards=3, backend="local", epochs=8, random_state=0, **SMALL)
    m.fit(Xtr, Ytr)
    return m


def test_three_shards_learn_like_one(tiny, three_shards):
    """S=3 is the same algorithm (global softmax over the union of the shards' active sets):
    P@1 at equal epochs within seed noise of the single-process engine (measured over seeds
    0, 1, 2: single process 0.50, 0.495, 0.495; three shards 0.47, 0.53, 0.53)."""
    Xtr, Ytr, Xte, Yte = tiny
    single = SlideClassifier(epochs=8, random_state=0, **SMALL).fit(Xtr, Ytr)
    p_single, p_sharded = single.score(Xte, Yte), three_shards.score(Xte, Yte)
    assert p_single >= 0.2 and p_sharded >= 0.2, (p_single, p_sharded)
    assert abs(p_single - p_sharded) <= 0.06, (p_single, p_sharded)
    # sparse serving: far above the most-frequent-label baseline, and exact when the prior
    # candidates cover every label
    assert three_shards.score(Xte, Yte, exact=False, prior_candidates=0) >= 0.1
    np.testing.assert_array_equal(three_shards.predict_topk(Xte, 3, exact=False,
                                                            prior_candidates=200),
                                  three_shards.predict_topk(Xte, 3))


def test_random_sampler_shards_serve_sparse(tiny):
    """The default sampler ("random") keeps no training tables: sparse serving goes through
    each shard's serving index, built from its weights; with the prior list covering every
    label it is the exact top-k, and the index alone does better than chance."""
    Xtr, Ytr, Xte, Yte = tiny
    cfg = dict(SMALL, sampler="random")
    m = ShardedSlideClassifier(n_shards=2, backend="local", epochs=3, random_state=0, **cfg)
    m.fit(Xtr, Ytr)
    assert all(not sh.net.indices for sh in m.backend_.shards)
    np.testing.assert_array_equal(m.predict_topk(Xte, 3, exact=False,
                                                 prior_candidates=m.n_labels_),
                                  m.predict_topk(Xte, 3))
    assert all(sh.net.serving is not None for sh in m.backend_.shards)
    chance = 1.0 / m.n_labels_
    assert m.score(Xte, Yte, exact=False, prior_candidates=0) > 5 * chance
    m.partial_fit(Xtr[:64], Ytr[:64])           # training drops the indices built before
    assert all(sh.net.serving is None for sh in m.backend_.shards)


def test_sharded_exact_topk_is_the_topk_of_the_full_scores(tiny, three_shards):
    _, _, Xte, _ = tiny
    S = three_shards.predict_scores(Xte)
    assert S.shape == (Xte.shape[0], 200)
    top = three_shards.predict_topk(Xte, 4)
    np.testing.assert_allclose(np.take_along_axis(S, top, 1),
                               -np.sort(-S, axis=1)[:, :4], rtol=1e-6)


def test_save_load_resume_continues_exactly(tiny, tmp_path):
    Xtr, Ytr, Xte, Yte = tiny
    kw = dict(n_shards=2, backend="local", epochs=2, random_state=5, **SMALL)
    ref = _losses(ShardedSlideClassifier(**kw), Xtr, Ytr)
    m = ShardedSlideClassifier(**kw)
    first = []
    m.fit(Xtr, Ytr, callback=lambda mm, i: first.append(i["loss"]) or i["batch"] >= 23)
    m.save(tmp_path / "ck")
    m.save(tmp_path / "ck")                      # a second save replaces the first's files
    assert len(list((tmp_path / "ck").glob("shard-*"))) == 2
    loaded = slide.load(tmp_path / "ck")
    assert isinstance(loaded, ShardedSlideClassifier) and loaded.batches_ == 23
    rest = _losses(loaded, Xtr, Ytr, resume=True)
    np.testing.assert_allclose(np.concatenate([first, rest]), ref, rtol=0, atol=1e-6)


def test_a_sharded_model_pickles_and_resumes_exactly(tiny):
    """pickle / joblib / deepcopy of a sharded model: its checkpoint directory's files travel,
    its shards start again on unpickling, and it predicts and trains on as the original.
    (Pickling syncs the optimizer's pending steps, as saving and predicting do: the original
    and its copies go on from the same synced state.)"""
    import copy
    import pickle
    Xtr, Ytr, Xte, Yte = tiny
    kw = dict(n_shards=2, backend="local", epochs=2, random_state=5, **SMALL)
    m = ShardedSlideClassifier(**kw)
    m.fit(Xtr, Ytr, callback=lambda mm, i: i["batch"] >= 23)
    m.compile_note_ = "kept"                     # a plain fitted attribute travels as is
    copied = pickle.loads(pickle.dumps(m))
    assert isinstance(copied, ShardedSlideClassifier) and copied.batches_ == 23
    assert copied.compile_note_ == "kept" and copied.backend_ is not m.backend_
    np.testing.assert_array_equal(copied.predict_topk(Xte, 5), m.predict_topk(Xte, 5))
    twice = copy.deepcopy(copied)
    del copied                                   # its shards are its own, not the copy's
    rest = _losses(twice, Xtr, Ytr, resume=True)
    assert rest.shape[0] > 10
    np.testing.assert_array_equal(rest, _losses(m, Xtr, Ytr, resume=True))
    np.testing.assert_array_equal(twice.predict_topk(Xte, 5), m.predict_topk(Xte, 5))
    # an unfitted one pickles as its keywords
    assert pickle.loads(pickle.dumps(ShardedSlideClassifier(**kw))).n_shards == 2


def test_single_process_and_sharded_models_convert_both_ways(tiny, three_shards, tmp_path):
    _, _, Xte, Yte = tiny
    single = to_single(three_shards)
    assert isinstance(single, SlideClassifier)
    np.testing.assert_array_equal(single.predict_topk(Xte, 5), three_shards.predict_topk(Xte, 5))
    back = from_single(single, 4)
    np.testing.assert_array_equal(back.predict_topk(Xte, 5), single.predict_topk(Xte, 5))
    assert back.backend_.n_shards == 4
    single.save(tmp_path / "compact.slide", optimizer_state=False)
    with pytest.raises(ValueError, match="without its optimizer's state"):
        from_single(slide.load(tmp_path / "compact.slide"), 2)


def test_bad_input_gives_clear_errors(tiny, tmp_path, three_shards):
    Xtr, Ytr, _, _ = tiny
    with pytest.raises(ValueError, match="n_shards must be between 1 and the number of labels"):
        ShardedSlideClassifier(n_shards=201, backend="local", **SMALL).fit(Xtr, Ytr)
    with pytest.raises(ValueError, match="exactly one hidden layer"):
        ShardedSlideClassifier(backend="local", hidden_sizes=(8, 8)).fit(Xtr, Ytr)
    with pytest.raises(ValueError, match="softmax"):
        ShardedSlideClassifier(backend="local", loss="sigmoid").fit(Xtr, Ytr)
    with pytest.raises(ValueError, match="backend"):
        ShardedSlideClassifier(backend="mpi").fit(Xtr, Ytr)
    three_shards.save(tmp_path / "ck")
    victim = sorted((tmp_path / "ck").glob("shard-*"))[1]
    victim.unlink()
    with pytest.raises(CheckpointError, match="missing"):
        slide.load(tmp_path / "ck")
    with pytest.raises(CheckpointError, match="manifest"):
        slide.load(tmp_path)
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(NotADirectoryError, match="saves into a directory.*a-file"):
        three_shards.save(tmp_path / "a-file")


# ----------------------------------------------------------------------------------------------
# the Ray backend (one local Ray session for the module)
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray",
                              reason="Ray is not installed (pip install -e '.[distributed]')")
    from slide.distributed.ray_backend import ensure_ray
    started = not ray.is_initialized()
    ensure_ray(None)           # slide's own sizing of a local Ray
    yield ray
    if started:
        ray.shutdown()


def test_ray_shards_train_exactly_like_the_local_backend(tiny, ray_session, tmp_path):
    Xtr, Ytr, Xte, Yte = tiny
    kw = dict(n_shards=2, epochs=1, random_state=7, **SMALL)
    local = _losses(ShardedSlideClassifier(backend="local", **kw), Xtr, Ytr)
    remote_model = ShardedSlideClassifier(backend="ray", **kw)
    remote = _losses(remote_model, Xtr, Ytr)
    # the same kernels on the same inputs; only the last bit may differ (measured 9e-16)
    np.testing.assert_allclose(remote, local, rtol=0, atol=1e-9)
    # checkpoints written by the actors load in process, and back into actors
    remote_model.save(tmp_path / "ck")
    back = slide.distributed.load(tmp_path / "ck", backend="local")
    np.testing.assert_array_equal(back.predict_topk(Xte, 3), remote_model.predict_topk(Xte, 3))
    remote_model._close_backend()


def test_one_ray_shard_with_results_from_the_object_store(tiny, ray_session):
    """Batches of 128 x 256 floats travel through Ray's object store and come back read-only
    (smaller ones are copied inline): the driver must not write into them."""
    Xtr, Ytr, _, _ = tiny
    kw = dict(SMALL, batch_size=128, hidden_sizes=(256,))
    kw = dict(n_shards=1, epochs=1, random_state=2, **kw)
    local = _losses(ShardedSlideClassifier(backend="local", **kw), Xtr, Ytr)
    m = ShardedSlideClassifier(backend="ray", **kw)
    np.testing.assert_allclose(_losses(m, Xtr, Ytr), local, rtol=0, atol=1e-9)
    m._close_backend()


def test_a_ray_model_loads_beside_the_one_that_saved_it(tiny, ray_session, tmp_path):
    """slide.load of a sharded checkpoint while the saving model's actors still live (the
    README's `big = slide.load(...)`): the new actors get CPUs instead of waiting forever;
    close() gives them back and a closed model says so."""
    Xtr, Ytr, Xte, _ = tiny
    m = ShardedSlideClassifier(n_shards=2, backend="ray", epochs=1, random_state=1, **SMALL)
    m.fit(Xtr, Ytr)
    m.save(tmp_path / "ck")
    free = ray_session.available_resources().get("CPU", 0)
    back = slide.load(tmp_path / "ck")
    np.testing.assert_array_equal(back.predict_topk(Xte, 3), m.predict_topk(Xte, 3))
    assert ray_session.available_resources().get("CPU", 0) < free
    back.close()
    with pytest.raises(RuntimeError, match="closed"):
        back.predict_topk(Xte, 3)
    m.close()


def kill_and_await_restart(ray, actor):
    """Kill a shard actor and wait until Ray has restarted it: the fresh actor (constructor's
    weights) must refuse the next batch rather than answer it (a call racing the kill fails
    either way)."""
    pid = ray.get(actor.pid.remote())
    ray.kill(actor, no_restart=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if ray.get(actor.pid.remote(), timeout=5) != pid:
                return
        except Exception:
            time.sleep(0.1)


def test_a_killed_shard_actor_is_restarted_from_the_last_checkpoint(tiny, ray_session, tmp_path):
    """ray.kill mid-fit: Ray restarts the actor, every shard and the driver go back to the
    checkpoint of batch 10 and training goes on; the run ends where an unbroken one does."""
    Xtr, Ytr, _, _ = tiny
    kw = dict(n_shards=2, epochs=1, random_state=8, **SMALL)
    ref = _losses(ShardedSlideClassifier(backend="local", **kw), Xtr, Ytr)
    m = ShardedSlideClassifier(backend="ray", **kw)
    seen = []

    def cb(model, info):
        seen.append((info["batch"], info["loss"]))
        if info["batch"] == 10 and not getattr(model, "recoveries_", 0):
            model.save(tmp_path / "ck")
        if info["batch"] == 14 and not getattr(model, "recoveries_", 0):
            kill_and_await_restart(ray_session, model.backend_.actors[1])

    m.fit(Xtr, Ytr, callback=cb)
    assert m.recoveries_ == 1
    batches = [b for b, _ in seen]
    assert batches[:14] == list(range(1, 15)) and batches[14] == 11    # resumed after batch 10
    assert batches[-1] == len(ref)
    np.testing.assert_allclose([l for _, l in seen[14:]], ref[10:], rtol=0, atol=1e-6)
    m._close_backend()


def test_an_address_that_does_not_answer_is_a_clear_error(tiny):
    import socket
    from slide.distributed.ray_backend import _check_address
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                   # nothing listens there now
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{port}"):
        _check_address(f"127.0.0.1:{port}")
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[distributed]')")
    Xtr, Ytr, _, _ = tiny
    with pytest.raises(ConnectionError, match="does not answer"):
        ShardedSlideClassifier(n_shards=2, ray_address=f"127.0.0.1:{port}", **SMALL).fit(Xtr, Ytr)


def test_slide_train_with_a_distributed_section(tmp_path, ray_session, capsys):
    """`[distributed] shards = 2`: the run trains the sharded model, writes checkpoint
    directories that rotate, resumes from the newest one and evaluates the saved model."""
    import os
    from slide.cli import main
    run = tmp_path / "run"
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'''output_dir = "{run}"
[data]
preset = "tiny"
eval_points = 100
[model]
hidden_sizes = [32]
[lsh]
K = 3
L = 10
range_pow = 9
bucket_size = 32
[sampler]
budget = 30
min_active = 40
shared_negatives = 16
[train]
epochs = 1
batch_size = 64
threads = 1
eval_every_batches = 5
checkpoint_every_batches = 3
keep_checkpoints = 2
[distributed]
shards = 2
''')
    assert main(["train", "--config", str(cfg)]) == 0, capsys.readouterr().err
    ckpts = sorted(os.listdir(run / "checkpoints"))
    assert ckpts == ["ckpt-000000009.slide", "ckpt-000000010.slide"]     # 10 batches, keep 2
    assert (run / "checkpoints" / ckpts[-1] / "manifest.json").is_file()
    assert isinstance(slide.load(run / "model.slide"), ShardedSlideClassifier)
    capsys.readouterr()
    assert main(["train", "--config", str(cfg), "--resume", "--set", "train.epochs=2"]) == 0
    out = capsys.readouterr().out
    assert "resuming from" in out and "batch 10" in out
    assert sorted(os.listdir(run / "checkpoints"))[-1] == "ckpt-000000020.slide"
    assert main(["evaluate", "--model", str(run), "--data",
                 str(run / "data" / "test.txt")]) == 0
    assert "P " in capsys.readouterr().out


def test_sharded_model_follows_a_time_budget_like_one_process(tiny, monkeypatch):
    """The sharded model trains in SlideClassifier's loop (slide.network.trainer.train), budget
    included: on a fake clock (1 s per reading; no rehash in the run, whose clock readings
    happen in the single process only) a 7 s budget stops both at the same batch, before the
    3 epochs' end, and one shard stays on the single process's trajectory."""
    from slide.network import trainer
    Xtr, Ytr, _, _ = tiny
    kw = dict(SMALL, epochs=3, random_state=3, time_budget=7.0, lr_schedule="cosine",
              rehash_period=10**6, rebuild_period=10**6)
    runs = []
    for model in (SlideClassifier(**kw), ShardedSlideClassifier(n_shards=1, backend="local",
                                                                **kw)):
        model._warm_up()
        monkeypatch.setattr(trainer, "time", FakeClock(1.0))
        infos = []
        losses = _losses(model, Xtr, Ytr, infos)
        monkeypatch.undo()
        assert model.budget_spent_ and not model.stopped_
        assert model.train_seconds_ >= 7.0 and model.epoch_ < 3
        runs.append((losses, [i["samples"] for i in infos], model.batches_))
    assert runs[1][2] == runs[0][2] >= 3
    np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=0, atol=1e-4)
    assert runs[1][1] == runs[0][1]


def test_a_sharded_model_saved_mid_run_predicts_after_loading_what_it_predicted(tiny, tmp_path):
    """Issue 28, sharded: the driver and every shard record the scheduled rates of their
    steps, so the first sync after loading catches rows up at those rates."""
    Xtr, Ytr, Xte, _ = tiny
    kw = dict(SMALL, n_shards=2, backend="local", epochs=3, random_state=5,
              lr_schedule="cosine")
    m = ShardedSlideClassifier(**kw)
    m.fit(Xtr, Ytr, callback=lambda mm, i: i["batch"] >= 30)
    assert m.batches_ == 30 and m.batch_in_epoch_ != 0
    m.save(tmp_path / "ck")
    loaded = slide.load(tmp_path / "ck")
    np.testing.assert_array_equal(loaded.predict_topk(Xte, 5), m.predict_topk(Xte, 5))
    np.testing.assert_array_equal(loaded.predict_proba(Xte), m.predict_proba(Xte))


def test_a_sharded_checkpoint_without_the_later_parameters_keeps_its_behaviour(tiny, tmp_path):
    """A driver file written before the neighbour vote existed loads with the network alone
    (neighbours=0, the behaviour of the code that wrote it), not today's default vote."""
    import json
    Xtr, Ytr, _, _ = tiny
    m = ShardedSlideClassifier(**dict(SMALL, n_shards=2, backend="local", epochs=1,
                                      random_state=1))
    m.fit(Xtr, Ytr, callback=lambda mm, i: i["batch"] >= 3)
    m.save(tmp_path / "ck")
    man = json.loads((tmp_path / "ck" / "manifest.json").read_text())
    driver = tmp_path / "ck" / man["driver"]
    with np.load(driver) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays.pop("__meta__").tobytes())
    for name in ("neighbours", "neighbour_weight", "rerank", "time_budget"):
        del meta["params"][name]
    with open(driver, "wb") as f:
        np.savez(f, __meta__=np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays)
    loaded = slide.load(tmp_path / "ck")
    assert (loaded.neighbours, loaded.rerank, loaded.time_budget) == (0, False, None)
    del meta["params"]["batch_size"]            # recorded by every sharded file
    with open(driver, "wb") as f:
        np.savez(f, __meta__=np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays)
    with pytest.raises(CheckpointError, match="'batch_size'"):
        slide.load(tmp_path / "ck")


def test_simulated_latency_delays_every_call_and_changes_nothing_else(tiny):
    """``simulated_latency_ms``: each call to the shards waits that long before it is sent and
    after its replies (two calls a batch: four waits), and the model trains the same bits."""
    Xtr, Ytr, _, _ = tiny
    kw = dict(SMALL, n_shards=2, backend="local", epochs=1, random_state=0)
    plain = ShardedSlideClassifier(**kw).fit(Xtr, Ytr)
    slow = ShardedSlideClassifier(**kw, simulated_latency_ms=5.0).fit(Xtr, Ytr)
    assert slow.batches_ == plain.batches_ > 0
    np.testing.assert_array_equal(slow.hidden_.W, plain.hidden_.W)
    np.testing.assert_array_equal(slow.predict_topk(Xtr[:20], 3), plain.predict_topk(Xtr[:20], 3))
    # 4 waits of 5 ms a batch, at least (time.sleep never returns early)
    assert slow.train_seconds_ - plain.train_seconds_ >= 0.9 * slow.batches_ * 4 * 0.005
    for bad in (-1.0, "fast", float("nan")):
        with pytest.raises(ValueError, match="simulated_latency_ms"):
            ShardedSlideClassifier(**dict(kw, simulated_latency_ms=bad)).fit(Xtr, Ytr)


def test_a_shard_runs_read_only_inputs_on_the_kernels_it_compiled(tiny):
    """Ray hands an actor's messages over as read-only arrays, and a short last batch is a
    slice: the shard copies them writable and gives each batch its own statistics, so an actor
    runs the kernels the in-process shard compiled, not a second specialisation of each."""
    from slide.distributed.driver import local_labels
    from slide.distributed.kernels import shard_backward_kernel, shard_forward_kernel
    Xtr, Ytr, _, _ = tiny
    m = ShardedSlideClassifier(n_shards=1, backend="local", epochs=1, random_state=0, **SMALL)
    m.fit(Xtr, Ytr)
    shard = m.backend_.shards[0]
    compiled = (len(shard_forward_kernel.signatures), len(shard_backward_kernel.signatures))
    rows = np.arange(5, dtype=np.int64)              # shorter than a batch
    H = m.hidden_.forward(Xtr, rows)
    (ptr, ind), = local_labels(Ytr, rows, m.bounds_)[0]
    n_labels = np.diff(Ytr.indptr)[rows].astype(np.int64)
    log_z = np.zeros(5)
    for a in (H, ptr, ind, n_labels, log_z):
        a.flags.writeable = False
    serial = m.batches_ + 1
    _, stats = shard.step(None, (serial, H, ptr, ind))
    assert stats.shape == (5, 5) and stats.flags.c_contiguous
    dH, _ = shard.step((serial, log_z, n_labels, 0.0), None)
    assert dH.shape == (5, H.shape[1])
    assert (len(shard_forward_kernel.signatures),
            len(shard_backward_kernel.signatures)) == compiled


def test_the_auto_width_is_resolved_saved_and_converted(tiny, tmp_path):
    Xtr, Ytr, Xte, _ = tiny
    kw = {k: v for k, v in SMALL.items() if k != "hidden_sizes"}
    m = ShardedSlideClassifier(n_shards=2, backend="local", epochs=1, random_state=0, **kw)
    m.fit(Xtr, Ytr)
    assert m.get_params()["hidden_sizes"] == "auto" and m.hidden_sizes_ == (256,)
    m.save(tmp_path / "ck")
    back = slide.load(tmp_path / "ck")
    assert back.get_params()["hidden_sizes"] == "auto" and back.hidden_sizes_ == (256,)
    np.testing.assert_array_equal(back.predict_topk(Xte, 5), m.predict_topk(Xte, 5))
    single = to_single(m)
    assert single.hidden_sizes_ == (256,)
    assert from_single(single, 3).hidden_sizes_ == (256,)
