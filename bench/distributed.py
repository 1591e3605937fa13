"""Label-sharded training on Ray (slide.distributed) against the single-process engine.

For each label count (synthetic xc200k preset, 200k labels, or its 670k-label variant) and each
configuration -- the single-process ``SlideClassifier`` and ``ShardedSlideClassifier`` with 1, 2
and 4 shards on a local Ray -- one fresh subprocess trains ONE epoch at the same seed and
reports: seconds per epoch (batch times from the fit callback, the first batch, which loads the
compiled kernels in new actor processes, replaced by the median), P@1 on the test split (exact
inference), bytes exchanged between the driver and the shards per batch, and peak memory per
process (getrusage high-water mark: the driver, and each shard actor). ``--cap-test`` also
trains the largest model with each shard actor under ``resource.setrlimit(RLIMIT_DATA)`` set
between the 1-shard and the 4-shard need, once with 1 shard (expected to fail) and once with 4.

    flock /tmp/slide-bench.lock python bench/distributed.py --labels 200000 --n-train 8000
    flock /tmp/slide-bench.lock python bench/distributed.py --labels 670091 --n-train 8000

``--latency-ms 0,0.5,2,5`` runs each sharded configuration once per simulated latency (every
message delayed that long each way: ``ShardedSlideClassifier(simulated_latency_ms=...)``).

Writes bench/results/distributed_<labels><tag>.json and appends the table to
bench/results/distributed.md. Timings on a shared 2-core machine are noisy; compare the ratios
of one run only.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def _data(labels, n_train, n_test, seed):
    from slide.synthetic import generate
    return generate("xc200k", seed=seed, n_labels=int(labels), n_train=int(n_train),
                    n_test=int(n_test))


def run_one(cfg):
    """One configuration in this process; returns its measurements."""
    import resource
    import slide
    Xtr, Ytr, Xte, Yte = _data(cfg["labels"], cfg["n_train"], cfg["n_test"], 0)
    kw = dict(hidden_sizes=(128,), epochs=1, batch_size=128, random_state=0, n_threads=2,
              learning_rate=5e-3, lr_schedule="constant",
              neighbours=0)     # the protocol's cost and P@1, without the vote on top
    S = cfg["shards"]
    if S == 0:
        model = slide.SlideClassifier(**kw)
    else:
        from slide.distributed import ShardedSlideClassifier
        # the driver and the shards take turns (the driver waits for the shards): the driver
        # gets both cores, the shards share them
        model = ShardedSlideClassifier(n_shards=S, backend="ray", shard_cpus=max(1, 2 // S),
                                       shard_memory_cap=cfg.get("cap"),
                                       simulated_latency_ms=cfg.get("latency_ms", 0.0), **kw)
    times, sent = [], []
    last = [time.perf_counter()]

    def cb(m, info):
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now
        sent.append(info.get("bytes_sent", 0))

    t0 = time.perf_counter()
    try:
        model.fit(Xtr, Ytr, callback=cb)
    except Exception as exc:      # the memory-cap run with one shard is expected to end here
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
                "seconds": time.perf_counter() - t0}
    bt = np.array(times)
    if S == 0:
        # one process: its kernels compile before the clock (the warm-up), and the callback
        # comes once a wave of batches in flight: its own training seconds are the epoch's
        epoch_s = model.train_seconds_
    else:
        # the shards compile (or load) their kernels in the first batch: the median instead
        if bt.size > 1:
            bt[0] = np.median(bt[1:])
        epoch_s = float(bt.sum())
    out = {"epoch_seconds": float(epoch_s), "batches": int(model.batches_),
           "P@1": model.score(Xte, Yte),
           "bytes_per_batch": float(np.mean(sent)) if S else 0.0,
           "driver_peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if S:
        mem = model.backend_.memory()
        out["shard_peak_rss"] = [m["peak_rss"] for m in mem]
        out["shard_peak_vm"] = [m.get("peak_vm") for m in mem]
        out["shard_data"] = [m.get("data") for m in mem]
        out["shard_array_bytes"] = model.backend_.call_all("memory_bytes")
        model._close_backend()
    return out


def _sub(cfg, timeout):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, __file__, "--one", json.dumps(cfg)], env=env,
                       capture_output=True, text=True, timeout=timeout)
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": (p.stderr or p.stdout)[-500:]}


def _md(labels, rows, args, commit):
    base = next((r for r in rows if r["config"] == "single process"), None)
    mb = 1 / 2**20
    lines = [f"\n## {labels:,} labels, {args.n_train:,} training points, 1 epoch "
             f"({time.strftime('%Y-%m-%d %H:%M')}, commit {commit})\n",
             "| configuration | s / epoch | vs single | P@1 | bytes / batch | driver peak RSS "
             "(MB) | shard peak RSS (MB) | shard arrays (MB) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['config']} | error: {r['error'][:120]} | | | | | | |")
            continue
        ratio = r["epoch_seconds"] / base["epoch_seconds"] if base and "epoch_seconds" in \
            base else float("nan")
        shard = ", ".join(f"{v * mb:.0f}" for v in r.get("shard_peak_rss", [])) or "-"
        arrays = ", ".join(f"{v * mb:.0f}" for v in r.get("shard_array_bytes", [])) or "-"
        lines.append(f"| {r['config']} | {r['epoch_seconds']:.1f} | {ratio:.2f}x | "
                     f"{r['P@1']:.4f} | {r['bytes_per_batch']:,.0f} | "
                     f"{r['driver_peak_rss'] * mb:.0f} | {shard} | {arrays} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--labels", type=int, default=200_000)
    ap.add_argument("--n-train", type=int, default=8000)
    ap.add_argument("--n-test", type=int, default=1000)
    ap.add_argument("--shards", default="0,1,2,4", help="0 = the single-process engine")
    ap.add_argument("--cap-mb", type=float, default=0.0,
                    help="also run 1 and 4 shards under this per-actor RLIMIT_DATA (MB)")
    ap.add_argument("--latency-ms", default="0",
                    help="comma list: each sharded run once per simulated latency (ms each way "
                         "of every message: ShardedSlideClassifier(simulated_latency_ms))")
    ap.add_argument("--tag", default="", help="appended to the .json file's name")
    ap.add_argument("--timeout", type=int, default=600)
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(run_one(json.loads(args.one))), flush=True)
        return
    # the driver only: the measured subprocesses (--one) do not import bench.common
    from bench import common
    commit = common.git_commit()
    rows = []
    base = dict(labels=args.labels, n_train=args.n_train, n_test=args.n_test)
    latencies = [float(v) for v in args.latency_ms.split(",") if v.strip()]
    for S in [int(s) for s in args.shards.split(",") if s.strip()]:
        for lat in ([0.0] if S == 0 else latencies):
            r = _sub({**base, "shards": S, "latency_ms": lat}, args.timeout)
            r["config"] = "single process" if S == 0 else \
                f"{S} shard{'s' * (S > 1)} (Ray)" + (f", {lat:g} ms latency" if lat else "")
            r["latency_ms"] = lat
            r["commit"] = commit
            print(r, flush=True)
            rows.append(r)
    if args.cap_mb:
        for S in (1, 4):
            r = _sub({**base, "shards": S, "cap": int(args.cap_mb * 2**20)}, args.timeout)
            r["config"] = f"{S} shard{'s' * (S > 1)}, RLIMIT_DATA {args.cap_mb:.0f} MB per actor"
            r["commit"] = commit
            print(r, flush=True)
            rows.append(r)
    from slide.fileio import write_text
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_text(RESULTS / f"distributed_{args.labels}{args.tag}.json", json.dumps(rows, indent=1))
    md = RESULTS / "distributed.md"
    old = md.read_text() if md.exists() else \
        "# Label-sharded training on Ray (bench/distributed.py)\n"
    write_text(md, old + _md(args.labels, rows, args, commit))
    print(_md(args.labels, rows, args, commit))


if __name__ == "__main__":
    main()
