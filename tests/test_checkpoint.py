"""The checkpoint file format: old files load, other versions are refused, writes are atomic."""
import io
import json
import os

import numpy as np
import pytest

from slide.persist import archive, checkpoint
from slide.persist.checkpoint import CheckpointError
from slide.persist.models import load
from slide.estimator import SlideClassifier

DATA = os.path.join(os.path.dirname(__file__), "data")
V1 = os.path.join(DATA, "checkpoint_v1.slide")
# the hyperparameters tests/data/checkpoint_v1.slide was trained with (stopped at batch 30)
V1_PARAMS = dict(hidden_sizes=(8,), K=3, L=4, range_pow=9, bucket_size=8, sampler_budget=30,
                 min_active=40, shared_negatives=16, rehash_period=5, rebuild_period=20,
                 rehash_decay=0.05, batch_size=32, learning_rate=1e-2, epochs=2,
                 lr_schedule="constant", sampler="vanilla",
                 random_state=0, n_threads=1)


def _sync_at_30(model, info):
    """Sync the optimizer at batch 30, where the checkpoints below were saved (saving syncs)."""
    if info["batch"] == 30:
        model.sync()
    return False


def test_a_checkpoint_written_before_the_split_loads_and_resumes_exactly(tiny):
    Xtr, Ytr, Xte, _ = tiny
    m = load(V1)
    assert m.checkpoint_meta_["version"] == 1
    assert (m.batches_, m.epoch_, m.batch_in_epoch_) == (30, 1, 11)
    # the predictions the writing code made just before saving
    np.testing.assert_array_equal(m.predict_topk(Xte[:20], k=3), m.extra_["top3_exact"])
    np.testing.assert_array_equal(m.predict_topk(Xte[:20], k=3, exact=False, prior_candidates=8),
                                  m.extra_["top3_sparse_prior8"])
    # it resumes (its first 30 batches were trained before issue 14's sampling fix changed
    # the LSH samplers' active sets, so it cannot match a run of today's code: the exact
    # resume is checked on a file today's code writes at the same point, below)
    m.fit(Xtr, Ytr, resume=True)
    per_epoch = -(-Xtr.shape[0] // V1_PARAMS["batch_size"])
    assert m.batches_ == V1_PARAMS["epochs"] * per_epoch       # it ran on to the end
    assert (m.epoch_, m.batch_in_epoch_) == (V1_PARAMS["epochs"], 0)
    assert np.isfinite(m.network_.W).all() and np.isfinite(m.network_.B).all()


@pytest.mark.parametrize("loss,cap", [("softmax", 256), ("softmax_each", 256), ("softmax", 1)])
def test_a_checkpoint_of_todays_code_resumes_exactly(tiny, tmp_path, loss, cap):
    """Also with every row's labels capped (cap 1: the resumed fit must cut them as the
    first did)."""
    Xtr, Ytr, Xte, _ = tiny
    params = dict(V1_PARAMS, loss=loss, max_row_labels=cap)
    part = SlideClassifier(**params).fit(Xtr, Ytr, callback=lambda m, info: info["batch"] >= 30)
    assert part.batches_ == 30
    part.predict_topk(Xte[:20], k=3)           # syncs the optimizer, as the v1 writer did
    path = str(tmp_path / "at30.slide")
    part.save(path)
    m = load(path)
    assert m.network_.loss == loss
    m.fit(Xtr, Ytr, resume=True)
    full = SlideClassifier(**params).fit(Xtr, Ytr, callback=_sync_at_30)
    assert m.batches_ == full.batches_ > 30
    np.testing.assert_array_equal(m.network_.W, full.network_.W)
    np.testing.assert_array_equal(m.network_.B, full.network_.B)


def _rewrite_meta(src, dst, **changes):
    with np.load(src) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays.pop("__meta__").tobytes())
    meta.update(changes)
    with open(dst, "wb") as f:     # a file object: np.savez would add ".npz" to a name
        np.savez(f, __meta__=np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays)


@pytest.mark.parametrize("version", [max(checkpoint.SUPPORTED_VERSIONS) + 1, 0, None])
def test_other_format_versions_are_refused_naming_both_versions(tmp_path, version):
    bad = tmp_path / "future.slide"
    _rewrite_meta(V1, bad, version=version)
    with pytest.raises(CheckpointError) as e:
        load(bad)
    msg = str(e.value)
    assert str(bad) in msg and f"format version {version!r}" in msg
    assert f"reads version {', '.join(map(str, checkpoint.SUPPORTED_VERSIONS))}" in msg


def test_a_failure_half_way_through_a_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch,
                                                                         tiny):
    Xtr, Ytr, _, _ = tiny
    path = tmp_path / "ckpt.slide"
    m = load(V1)
    m.save(path, extra={"which": "first"})
    before = path.read_bytes()
    m.fit(Xtr, Ytr, resume=True)           # the model moves on; its next save must fail

    real_writer = checkpoint._write_arrays
    written = {}

    def half_then_fail(f, meta, arrays):
        buf = io.BytesIO()
        real_writer(buf, meta, arrays)
        data = buf.getvalue()
        f.write(data[: len(data) // 2])
        written["bytes"] = len(data) // 2
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "_write_arrays", half_then_fail)
    with pytest.raises(OSError, match="No space"):
        m.save(path, extra={"which": "second"})
    assert written["bytes"] > 1000                       # the failure really came mid-write
    assert path.read_bytes() == before                   # the previous file, byte for byte
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.slide"]   # no temporary left
    back = load(path)
    assert back.extra_ == {"which": "first"} and back.batches_ == 30


def _saved_small_model(tiny, path):
    Xtr, Ytr, _, _ = tiny
    model = SlideClassifier(**dict(V1_PARAMS, epochs=1)).fit(Xtr, Ytr)
    model.save(path)
    return model


def test_load_reads_each_array_only_to_copy_it(tiny, tmp_path, monkeypatch):
    """slide.load checks the listed arrays from their headers, builds the model, then reads
    each saved array when it copies it (a large model is never in memory twice: a 670k-label
    file peaked at twice its size when every array was read first)."""
    from collections import Counter
    path = tmp_path / "m.slide"
    model = _saved_small_model(tiny, path)
    npz, meta = checkpoint.open_checkpoint(path)
    arrays = archive.ArchiveArrays(npz)
    NpzFile = type(npz)
    original = NpzFile.__getitem__

    def refuse(self, name):
        raise AssertionError(f"array {name} read by a shape check")
    monkeypatch.setattr(NpzFile, "__getitem__", refuse)
    archive.check_listed_arrays(str(path), meta, arrays)        # headers only
    monkeypatch.undo()
    npz.close()
    reads = Counter()

    def count(self, name):
        reads[name] += 1
        return original(self, name)
    monkeypatch.setattr(NpzFile, "__getitem__", count)
    back = load(path)
    monkeypatch.undo()
    assert reads["W"] <= 2 and reads["opt_MW"] == 1 and reads["__meta__"] == 1    # finite, copy
    Xte = tiny[2]
    np.testing.assert_array_equal(back.predict_topk(Xte, 5), model.predict_topk(Xte, 5))
    np.testing.assert_array_equal(back.network_.W, model.network_.W)


def test_a_damaged_array_is_refused_as_unreadable(tiny, tmp_path):
    import zipfile
    path = tmp_path / "m.slide"
    _saved_small_model(tiny, path)
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("W.npy")
    start = info.header_offset
    name_len = int.from_bytes(raw[start + 26:start + 28], "little")
    extra_len = int.from_bytes(raw[start + 28:start + 30], "little")
    raw[start + 30 + name_len + extra_len + info.file_size // 2] ^= 0xFF   # inside W's data
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="m.slide.*unreadable"):
        load(path)


@pytest.mark.parametrize("stop_at", [7, 45, 100])
def test_a_model_saved_mid_run_predicts_after_loading_what_it_predicted(tiny, tmp_path, stop_at):
    """Issue 28: the first sync after loading (every prediction) applies the rows' pending
    momentum steps; it must use the rates those steps had under the cosine schedule (the
    optimizer's record of them is saved), not the base rate the loaded model starts with."""
    Xtr, Ytr, Xte, _ = tiny
    kw = dict(hidden_sizes=(16,), batch_size=32, epochs=6, lr_schedule="cosine",
              random_state=2, n_threads=1, neighbours=0)
    model = SlideClassifier(**kw).fit(Xtr, Ytr, callback=lambda m, i: i["batch"] >= stop_at)
    assert model.batches_ == stop_at and model.batch_in_epoch_ != 0    # mid-epoch
    assert model.optimizer_.pending
    path = tmp_path / "mid.slide"
    model.save(path)
    loaded = load(path)
    np.testing.assert_array_equal(loaded.predict_topk(Xte, k=5), model.predict_topk(Xte, k=5))
    np.testing.assert_array_equal(loaded.predict_proba(Xte), model.predict_proba(Xte))
    np.testing.assert_array_equal(loaded.network_.W, model.network_.W)


# what a format-1 file written before each parameter existed lacks, and the behaviour it had
PRE_PARAMETER_BEHAVIOUR = dict(shared_negatives=0, sampling_correction=False, negative_power=0.0,
                               output_bias_init="zero", lr_schedule="constant", warmup_batches=0,
                               time_budget=None, neighbours=0, neighbour_weight=0.85,
                               rerank=False)


def _as_format_1(src, dst, drop):
    """The checkpoint ``src`` rewritten as format 1: without the step rates (format 2) and
    without the parameters ``drop`` (as a file written before they existed)."""
    with np.load(src) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays.pop("__meta__").tobytes())
    del arrays["opt_rates"], meta["arrays"]["opt_rates"]
    meta["version"] = 1
    for name in drop:
        del meta["params"][name]
    with open(dst, "wb") as f:
        np.savez(f, __meta__=np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays)


def test_parameters_an_old_file_does_not_record_keep_the_behaviour_it_was_written_with(
        tiny, tmp_path):
    """A format-1 file written before the vote and its re-ranker existed must not resume with
    today's defaults (rerank=True would hold out a tenth of the rows the network already
    trained on): each parameter it lacks is pinned to what the code that wrote it did."""
    path = tmp_path / "new.slide"
    _saved_small_model(tiny, path)
    old = tmp_path / "old.slide"
    _as_format_1(path, old, drop=PRE_PARAMETER_BEHAVIOUR)
    m = load(old)
    assert {k: m.get_params()[k] for k in PRE_PARAMETER_BEHAVIOUR} == PRE_PARAMETER_BEHAVIOUR
    assert m._n_held(20_000, 100) == 0           # a resumed fit holds no row out
    assert SlideClassifier()._n_held(20_000, 100) > 0
    # a parameter the file records keeps its recorded value
    assert m.get_params()["hidden_sizes"] == V1_PARAMS["hidden_sizes"]


def test_a_format_2_file_must_record_every_parameter_and_the_step_rates(tiny, tmp_path):
    path = tmp_path / "new.slide"
    _saved_small_model(tiny, path)
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays.pop("__meta__").tobytes())
    no_param = dict(meta, params={k: v for k, v in meta["params"].items() if k != "rerank"})
    _write(tmp_path / "no_param.slide", no_param, arrays)
    with pytest.raises(CheckpointError, match="no_param.slide.*'rerank'"):
        load(tmp_path / "no_param.slide")
    del arrays["opt_rates"]
    no_rates = dict(meta, arrays={k: v for k, v in meta["arrays"].items() if k != "opt_rates"})
    _write(tmp_path / "no_rates.slide", no_rates, arrays)
    with pytest.raises(CheckpointError, match="no_rates.slide.*'opt_rates' is missing"):
        load(tmp_path / "no_rates.slide")


def _write(path, meta, arrays):
    with open(path, "wb") as f:
        np.savez(f, __meta__=np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays)


def test_a_model_saved_without_its_optimizer_state_predicts_alike_and_cannot_train_on(
        tiny, tmp_path):
    """``save(..., optimizer_state=False)``: a model to predict with. Saved mid-epoch, with
    steps pending, it syncs first, so the file predicts what the model does; it leaves out
    Adam's moments and step records (a smaller file of its own version), and the loaded model
    refuses to train on (from zero moments it would be neither its run nor a fresh one) but
    fits afresh, and stays without the state through a pickle and a second save."""
    import pickle
    Xtr, Ytr, Xte, _ = tiny
    kw = dict(hidden_sizes=(16,), batch_size=32, epochs=6, lr_schedule="cosine",
              random_state=2, n_threads=1, neighbours=0)
    model = SlideClassifier(**kw).fit(Xtr, Ytr, callback=lambda m, i: i["batch"] >= 45)
    assert model.optimizer_.pending
    full, small = tmp_path / "full.slide", tmp_path / "small.slide"
    with pytest.raises(ValueError, match="optimizer_state must be True or False"):
        model.save(small, optimizer_state="no")
    assert not small.exists() and model.optimizer_.pending      # refused before anything
    model.save(small, optimizer_state=False)
    assert not model.optimizer_.pending and model.optimizer_.has_state
    model.save(full)
    meta, arrays = checkpoint.read(small)
    assert meta["version"] == checkpoint.NO_OPTIMIZER_VERSION and not meta["optimizer_state"]
    assert not [name for name in arrays if name.startswith("opt_")]
    assert os.path.getsize(small) < 0.6 * os.path.getsize(full)
    loaded = load(small)
    assert not loaded.optimizer_.has_state
    np.testing.assert_array_equal(loaded.predict_topk(Xte, k=5), model.predict_topk(Xte, k=5))
    np.testing.assert_array_equal(loaded.predict_proba(Xte), model.predict_proba(Xte))
    for train_on in (lambda m: m.fit(Xtr, Ytr, resume=True), lambda m: m.partial_fit(Xtr, Ytr)):
        with pytest.raises(ValueError, match="without its optimizer's state"):
            train_on(loaded)
    np.testing.assert_array_equal(loaded.network_.W, load(small).network_.W)   # untouched
    again = pickle.loads(pickle.dumps(loaded))
    assert not again.optimizer_.has_state
    np.testing.assert_array_equal(again.network_.W, loaded.network_.W)
    loaded.save(tmp_path / "resaved.slide")         # a state it does not have is not invented
    assert not checkpoint.read(tmp_path / "resaved.slide")[0]["optimizer_state"]
    loaded.fit(Xtr, Ytr)                            # a fresh fit builds a fresh optimizer
    assert loaded.optimizer_.has_state and loaded.batches_ > 45


def test_a_file_without_optimizer_state_is_refused_by_its_version_where_the_reader_is_older(
        tiny, tmp_path):
    """Readers of version 7 and before require the moments; the version tells them first."""
    Xtr, Ytr, _, _ = tiny
    model = SlideClassifier(hidden_sizes=(8,), epochs=1, n_threads=1, neighbours=0,
                            random_state=0).fit(Xtr, Ytr)
    small = tmp_path / "small.slide"
    model.save(small, optimizer_state=False)
    as_old = tmp_path / "as_old.slide"
    _rewrite_meta(small, as_old, version=checkpoint.FORMAT_VERSION, optimizer_state=True)
    with pytest.raises(CheckpointError, match="optimizer array 'opt_"):
        load(as_old)
    assert checkpoint.NO_OPTIMIZER_VERSION > checkpoint.FUSED_ENSEMBLE_VERSION
