"""One system's subprocess: ``python -m bench.worker SPEC.json`` (started by
``bench.common.run_in_subprocess``). Loads the prepared data, picks the system's runner, trains,
evaluates and writes the result JSON with the process's peak resident memory.

This is the only module that knows every runner; ``bench.common`` imports none of them, and each
runner imports only ``bench.common`` (and the shared dense loop), so nothing imports in a circle.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import math
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common  # noqa: E402

# system -> (module, function). A runner is called as
# run(spec, meta, X_tr, Y_tr, X_te, Y_te, X_ev, Y_ev, threads) -> (Recorder, final, extra).
RUNNERS = {
    "slide": ("bench.slide_runner", "run"),
    "slide_lsh": ("bench.slide_runner", "run"),
    "slide_dense": ("bench.slide_runner", "run"),
    "tf": ("bench.baselines.tf_dense", "run_dense"),
    "tf_sampled": ("bench.baselines.tf_dense", "run_sampled"),
    "torch": ("bench.baselines.torch_dense", "run"),
    "torch_sampled": ("bench.baselines.torch_sampled", "run"),
    "omikuji": ("bench.baselines.label_trees", "run_omikuji"),
    "omikuji_bonsai": ("bench.baselines.label_trees", "run_omikuji"),
    "napkinxc": ("bench.baselines.label_trees", "run_napkinxc"),
}
# the source files a baseline's result depends on (its cache key digests them)
SOURCES = {
    "tf": ("baselines/tf_dense.py", "dense_loop.py"),
    "tf_sampled": ("baselines/tf_dense.py", "dense_loop.py"),
    "torch": ("baselines/torch_dense.py", "dense_loop.py"),
    "torch_sampled": ("baselines/torch_sampled.py", "baselines/torch_dense.py",
                      "baselines/tf_dense.py", "dense_loop.py"),
    "omikuji": ("baselines/label_trees.py",),
    "omikuji_bonsai": ("baselines/label_trees.py",),
    "napkinxc": ("baselines/label_trees.py",),
}


def source_digest(system):
    """Digest of the bench sources a baseline's result depends on."""
    h = hashlib.sha1()
    for rel in SOURCES[system]:
        h.update(common._file_digest(Path(__file__).parent / rel).encode())
    return h.hexdigest()[:12]


def runner(system):
    """The run function of ``system`` (imported only in that system's own process)."""
    if system not in RUNNERS:
        raise ValueError(f"unknown system {system!r} (known: {', '.join(RUNNERS)})")
    module, name = RUNNERS[system]
    return getattr(importlib.import_module(module), name)


def summarise(spec, rec, meta, extra):
    """The result fields every system shares, from its Recorder (the runner's ``extra`` may
    override them: a one-shot label tree has one fit instead of batches)."""
    bpe = math.ceil(meta["n_train"] / spec["batch_size"])
    n = len(rec.batch_end)
    total = rec.batch_end[-1] if n else 0.0
    epoch_seconds = []
    for e in range(n // bpe):
        start = rec.batch_end[e * bpe - 1] if e else 0.0
        epoch_seconds.append(rec.batch_end[(e + 1) * bpe - 1] - start)
    samples = common.samples_done(n, meta["n_train"], spec["batch_size"])
    # no spec sets untimed warm-up batches any more (compilation is outside the clock, and
    # the scaling sweep trains whole epochs): the mean batch of a partial run (--max-batches)
    steady = total / n if n > 1 else None
    out = {
        "system": spec["system"], "label": common.LABELS.get(spec["system"], spec["system"]),
        "n_batches": n, "batches_per_epoch": bpe, "samples": samples,
        "train_seconds": total, "epoch_seconds": epoch_seconds,
        "samples_per_second": samples / total if total > 0 else None,
        # time per batch, and the epoch time it extrapolates to (partial runs)
        "steady_seconds_per_batch": steady,
        # an epoch's time from the end of the first batch on: what a system's setup before it
        # (slide's fit builds its model inside the clock, TF builds its variables before its
        # clock starts) does not count in; and that first batch's end
        "steady_epoch_seconds": ((rec.batch_end[-1] - rec.batch_end[0]) / (n - 1) * bpe
                                 if n > 1 else None),
        "first_batch_end_seconds": rec.batch_end[0] if n else None,
        "extrapolated_epoch_seconds": steady * bpe if steady is not None else None,
        "eval_seconds_total": rec.eval_seconds,
        "cpu_utilisation": _utilisation(rec, spec["threads"]),
        "curve": rec.curve,
        "losses": rec.losses,
        "batch_end_seconds": [round(t, 4) for t in rec.batch_end],
    }
    out.update(extra)
    return out


def _utilisation(rec, threads):
    """Process CPU seconds per training second per thread, from the end of the first batch to
    the end of the last, evaluations inside that window subtracted (an evaluation runs right
    after its batch's stamp, so the one after the last batch lies outside)."""
    n = len(rec.batch_end)
    if n < 2 or rec.cpu_first is None:
        return None
    wall = rec.batch_end[-1] - rec.batch_end[0]
    inside = sum(c["eval_cpu"] for c in rec.curve if c["batch"] < n)
    cpu = rec.cpu_last - rec.cpu_first - inside
    return round(cpu / (wall * threads), 3) if wall > 0 else None


def worker_main(spec_path):
    """Entry point of one system's subprocess: train, evaluate, write the result JSON."""
    spec = json.loads(Path(spec_path).read_text())
    system = spec["system"]
    run = runner(system)
    T = int(spec["threads"])
    t_start = time.perf_counter()
    meta = spec["meta"]
    X_tr, Y_tr, X_te, Y_te = common.load_data(meta)
    n_eval = spec.get("n_eval")
    n_eval = X_te.shape[0] if n_eval is None else min(int(n_eval), X_te.shape[0])
    X_ev, Y_ev = X_te[:n_eval], Y_te[:n_eval]
    rss_data = common.current_rss_bytes()
    load_start = os.getloadavg() if hasattr(os, "getloadavg") else None
    prefault_s = common.prefault(float(spec.get("prefault_gib") or 0))
    rec, final, extra = run(spec, meta, X_tr, Y_tr, X_te, Y_te, X_ev, Y_ev, T)
    res = summarise(spec, rec, meta, extra)
    res.update({
        "final_test": final, "n_eval": n_eval, "threads": T,
        "peak_rss_bytes": common.peak_rss_bytes(), "rss_after_data_bytes": rss_data,
        "process_seconds": time.perf_counter() - t_start,
        "loadavg_start": load_start, "prefault_seconds": prefault_s,
        "loadavg_end": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "spec": {k: v for k, v in spec.items() if k != "meta"},
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": common.git_commit(),
    })
    out = Path(spec["result_path"])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1))
    tmp.replace(out)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m bench.worker SPEC.json  (internal: one system's worker)")
    worker_main(sys.argv[1])
