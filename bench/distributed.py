"""Label-sharded training (slide.distributed) against the single-process engine.

Each configuration -- the single-process ``SlideClassifier`` and ``ShardedSlideClassifier``
with each number of shards, each pipeline depth and each simulated latency -- trains in a
fresh subprocess at each seed and reports: seconds per epoch (the epochs after the first: the
first loads the compiled kernels in new actor processes; with ``--epochs 1``, the batch times
with the first batch replaced by their median), samples per second, P@1 on the test split
(exact inference), bytes exchanged between the driver and the shards per batch, and peak
memory per process (getrusage high-water mark: the driver, and each shard actor).

Data: the synthetic xc200k preset at ``--labels`` labels (default), or a real set with
``--data DIR`` (``DIR/train.txt`` and ``DIR/test.txt`` in the XC format, e.g. the sets that
``bench/build_debdeps.py`` and ``bench/build_debcontents.py`` build into ``datasets/``).

    flock /tmp/slide.lock python bench/distributed.py --labels 200000 --n-train 8000
    flock /tmp/slide.lock python bench/distributed.py --data datasets/debdeps --epochs 3 \
        --shards 0,2 --depths 1,3 --seeds 0,1,2 --tag _debdeps
    flock /tmp/slide.lock python bench/distributed.py --data datasets/debdeps --epochs 2 \
        --shards 2 --depths 1,3 --latency-ms 0,0.5,2,5 --tag _debdeps_latency

``--latency-ms 0,0.5,2,5`` runs each sharded configuration once per simulated latency (every
message delayed that long each way: ``ShardedSlideClassifier(simulated_latency_ms=...)``).
``--model`` also measures the cost model's inputs (``compute_costs``: each shard count's
compute alone, in one process; ``message_costs``: its messages alone, to idle shards) and
tabulates its predictions (``predict_ms``) against every sharded configuration; the machine's
effective cores are fitted to the run's points, or given with ``--effective-cores`` (a fit from
another run, to check the model on points it was not fitted to):

    flock /tmp/slide.lock python bench/distributed.py --labels 200000 --n-train 30000 \
        --epochs 3 --seeds 0,1 --shards 0,1,2,4 --depths 1,2,3 --model --tag _model
    flock /tmp/slide.lock python bench/distributed.py --data datasets/debdeps --epochs 3 \
        --seeds 0,1 --shards 0,2,4 --depths 1,3 --latency-ms 0,2 --model \
        --effective-cores C --tag _model       # C: the first run's fit
``--cap-mb`` also trains the largest model with each shard actor under
``resource.setrlimit(RLIMIT_DATA)`` set between the 1-shard and the 4-shard need, once with 1
shard (expected to fail) and once with 4.

Writes bench/results/distributed_<labels or set><tag>.json (the runs, and the cost model's
inputs and points) and appends the table (mean and standard deviation over the seeds) to
bench/results/distributed.md. Timings on a shared 2-core
machine are noisy; compare the ratios of one run only.
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


def _data(cfg):
    if cfg.get("data"):
        from slide.data import read_xc
        Xtr, Ytr = read_xc(str(Path(cfg["data"]) / "train.txt"))
        Xte, Yte = read_xc(str(Path(cfg["data"]) / "test.txt"))
        return Xtr, Ytr, Xte, Yte
    from slide.synthetic import generate
    return generate("xc200k", seed=0, n_labels=int(cfg["labels"]), n_train=int(cfg["n_train"]),
                    n_test=int(cfg["n_test"]))


def _fit_params(cfg, epochs):
    kw = dict(hidden_sizes=(128,), epochs=epochs, batch_size=128, random_state=cfg["seed"],
              n_threads=2, neighbours=0)     # the network's cost and P@1, no vote on top
    if not cfg.get("data"):
        kw.update(learning_rate=5e-3, lr_schedule="constant")
    return kw


def run_one(cfg):
    """One configuration in this process; returns its measurements."""
    import resource
    import slide
    Xtr, Ytr, Xte, Yte = _data(cfg)
    epochs = int(cfg.get("epochs", 1))
    kw = _fit_params(cfg, epochs)
    S = cfg["shards"]
    if S == 0:
        model = slide.SlideClassifier(**kw)
    else:
        from slide.distributed import ShardedSlideClassifier
        # one thread a shard: the driver keeps working (and waiting) beside the shards; a lone
        # shard given both cores of a 2-core machine ran its parallel loops against them
        # several times slower
        model = ShardedSlideClassifier(n_shards=S, backend=cfg.get("backend", "ray"),
                                       shard_cpus=1,
                                       shard_memory_cap=cfg.get("cap"),
                                       simulated_latency_ms=cfg.get("latency_ms", 0.0),
                                       pipeline_depth=cfg.get("depth", 1), **kw)
    times, sent, at_epoch = [], [], {}
    last = [time.perf_counter()]

    def cb(m, info):
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now
        sent.append(info.get("bytes_sent", m.__dict__.get("bytes_per_batch_", 0.0)))
        # the training seconds when the model first stands at an epoch's start
        at_epoch.setdefault(m.epoch_, info["train_seconds"])

    t0 = time.perf_counter()
    try:
        model.fit(Xtr, Ytr, callback=cb)
    except Exception as exc:      # the memory-cap run with one shard is expected to end here
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
                "seconds": time.perf_counter() - t0}
    if epochs > 1:
        # the epochs after the first (the first loads the compiled kernels in the actors)
        epoch_s = (at_epoch[epochs] - at_epoch[1]) / (epochs - 1)
    elif S == 0:
        # one process: its kernels compile before the clock (the warm-up), and the callback
        # comes once a wave of batches in flight: its own training seconds are the epoch's
        epoch_s = model.train_seconds_
    else:
        bt = np.array(times)
        if bt.size > 1:
            bt[0] = np.median(bt[1:])
        epoch_s = float(bt.sum())
    out = {"epoch_seconds": float(epoch_s), "samples_per_s": Xtr.shape[0] / float(epoch_s),
           "train_seconds": float(model.train_seconds_),
           "batches": int(model.batches_), "P@1": model.score(Xte, Yte),
           "bytes_per_batch": float(np.mean(sent)) if S else 0.0,
           "driver_peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if S:
        mem = model.backend_.memory() if hasattr(model.backend_, "memory") else []
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


def _config_name(S, backend, depth, latency):
    if S == 0:
        return "single process"
    name = f"{S} shard{'s' * (S > 1)} ({'Ray' if backend == 'ray' else 'in process'})"
    name += f", depth {depth}" if depth > 1 else ", synchronous"
    return name + (f", {latency:g} ms latency" if latency else "")


def _mean_sd(values):
    v = np.asarray(values, float)
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0


def _md(title, rows, args, commit):
    from bench import common
    mb = 1 / 2**20
    groups = {}
    for r in rows:
        groups.setdefault(r["config"], []).append(r)
    base = [r for r in groups.get("single process", []) if "error" not in r]
    base_sps = _mean_sd([r["samples_per_s"] for r in base])[0] if base else float("nan")
    seeds = sorted({r.get("seed", 0) for r in rows})
    lines = [f"\n## {title}, {args.epochs} epoch{'s' * (args.epochs > 1)}, seeds "
             f"{', '.join(map(str, seeds))} ({time.strftime('%Y-%m-%d %H:%M')}, commit {commit})\n",
             f"Machine: {_machine(common)}. Mean (sd) over the seeds.\n",
             "| configuration | s / epoch | samples / s | x single | P@1 | bytes / batch | "
             "driver peak RSS (MB) | shard peak RSS (MB) |",
             "|---|---|---|---|---|---|---|---|"]
    for name, rs in groups.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            lines.append(f"| {name} | error: {rs[0]['error'][:120]} | | | | | | |")
            continue
        es, es_sd = _mean_sd([r["epoch_seconds"] for r in ok])
        sps, sps_sd = _mean_sd([r["samples_per_s"] for r in ok])
        p1, p1_sd = _mean_sd([r["P@1"] for r in ok])
        shard = ", ".join(f"{v * mb:.0f}" for v in ok[0].get("shard_peak_rss", [])) or "-"
        lines.append(f"| {name} | {es:.2f} ({es_sd:.2f}) | {sps:,.0f} ({sps_sd:,.0f}) | "
                     f"{sps / base_sps:.2f}x | {p1:.4f} ({p1_sd:.4f}) | "
                     f"{np.mean([r['bytes_per_batch'] for r in ok]):,.0f} | "
                     f"{np.mean([r['driver_peak_rss'] for r in ok]) * mb:.0f} | {shard} |")
    return "\n".join(lines) + "\n"


class _IdleShard:
    """A shard that answers a batch's message at once with replies of a real one's size."""

    def step(self, backward, forward):
        dH = np.zeros((128, 128), np.float32) if backward is not None else None
        stats = np.zeros((5, 128)) if forward is not None else None
        return dH, stats


def message_costs(n_batches=400, n_shards=2, transports=("actor calls", "compiled graph"),
                  in_flight=(0, 1, 2, 4)):
    """Milliseconds a batch of the messages alone (shards that do nothing) on a local Ray:
    actor calls and the compiled graph, synchronous (two messages a batch, each waited: k = 0)
    and pipelined (one a batch, k in flight), and the driver's CPU time a batch (its
    waiting)."""
    import resource
    from slide.distributed import ray_backend

    class IdleActor(ray_backend._ShardActorImpl):
        def __init__(self):
            self.restarted = False
            self.shard = _IdleShard()

    ray = ray_backend.ensure_ray(None)
    backend = ray_backend.RayBackend(None, 1)
    backend.ray = ray
    backend.actors = [ray.remote(num_cpus=1)(IdleActor).remote() for _ in range(n_shards)]
    H = np.zeros((128, 128), np.float32)
    fwd = (1, H, np.zeros(129, np.int64), np.zeros(2000, np.int32))
    bwd = (1, np.zeros(128), np.zeros(128, np.int64), 0.01)
    out = []

    def cpu():
        u = resource.getrusage(resource.RUSAGE_SELF)
        return u.ru_utime + u.ru_stime

    for transport in transports:
        if transport == "compiled graph":
            backend.compile_graph("step", 8)
        for k in in_flight:
            for _ in range(20):
                backend.call_each("step", [(None, fwd)] * n_shards)
            t0, c0 = time.perf_counter(), cpu()
            pending = []
            for _ in range(n_batches):
                if k == 0:
                    backend.call_each("step", [(None, fwd)] * n_shards)
                    backend.call_each("step", [(bwd, None)] * n_shards)
                    continue
                if len(pending) >= k:
                    backend.wait(pending.pop(0))
                pending.append(backend.submit_each("step", [(bwd, fwd)] * n_shards))
            for h in pending:
                backend.wait(h)
            wall, used = time.perf_counter() - t0, cpu() - c0
            out.append(dict(transport=transport, in_flight=k, n_shards=n_shards,
                            ms_per_batch=1e3 * wall / n_batches,
                            driver_cpu_ms_per_batch=1e3 * used / n_batches))
            print(out[-1], flush=True)
    backend.shutdown()
    return out


def _messages_md(rows, args, commit, common):
    from slide.fileio import write_text
    lines = [f"\n## Two idle shards, batches of 128 x 128 ({time.strftime('%Y-%m-%d %H:%M')}, "
             f"commit {commit})\n", f"Machine: {_machine(common)}.\n",
             "| transport | messages in flight | ms a batch | driver CPU ms a batch |",
             "|---|---|---|---|"]
    for r in rows:
        k = "synchronous (2 a batch)" if r["in_flight"] == 0 else str(r["in_flight"])
        lines.append(f"| {r['transport']} | {k} | {r['ms_per_batch']:.2f} | "
                     f"{r['driver_cpu_ms_per_batch']:.2f} |")
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    md = out / "ray_messages.md"
    old = md.read_text() if md.exists() else \
        "# The messages alone (bench/distributed.py --messages)\n"
    write_text(md, old + "\n".join(lines) + "\n")
    print("\n".join(lines))


def compute_costs(cfg):
    """The compute of a sharded batch alone, for the cost model (``predict_ms``): the
    synchronous loop of ``cfg["shards"]`` shards in this process, no messages, BLAS on one
    thread; each shard's messages timed on one thread, the driver (its hidden layer, the
    labels' split, the normaliser) on two. Returns ms a batch of the driver and of each shard,
    over the epochs after the first."""
    import numba
    from threadpoolctl import threadpool_limits
    from slide.distributed import ShardedSlideClassifier
    from slide.distributed.backend import LocalBackend

    class TimedShards(LocalBackend):
        """Shards in process whose messages are timed, each on one thread (as a Ray shard of
        these runs has): ``busy[q]``, the seconds shard q spent in its messages."""

        def create(self, specs, files=None):
            self.busy = [0.0] * len(specs)
            return super().create(specs, files)

        def call_each(self, method, args_list):
            if method != "step":
                return super().call_each(method, args_list)
            threads, out = numba.get_num_threads(), []
            numba.set_num_threads(1)
            try:
                for q, (shard, args) in enumerate(zip(self.shards, args_list)):
                    t0 = time.perf_counter()
                    out.append(shard.step(*args))
                    self.busy[q] += time.perf_counter() - t0
            finally:
                numba.set_num_threads(threads)
            return out

    class Timed(ShardedSlideClassifier):
        def _make_backend(self):
            return TimedShards()

    Xtr, Ytr, _, _ = _data(cfg)
    epochs = max(2, int(cfg.get("epochs", 2)))
    kw = _fit_params(cfg, epochs)
    model = Timed(n_shards=cfg["shards"], backend="local", **kw)
    marks = {}

    def cb(m, info):
        marks.setdefault(m.epoch_, (info["train_seconds"], list(m.backend_.busy), m.batches_))

    with threadpool_limits(limits=1):
        model.fit(Xtr, Ytr, callback=cb)
    (t1, busy1, n1), (t2, busy2, n2) = marks[1], marks[epochs]
    n = n2 - n1
    shard_ms = [1e3 * (b2 - b1) / n for b1, b2 in zip(busy1, busy2)]
    model._close_backend()
    return {"driver_ms": 1e3 * (t2 - t1) / n - sum(shard_ms), "shard_ms": shard_ms,
            "batches": n}


def predict_ms(driver_ms, shard_ms, message_ms, depth, latency_ms, cores=None):
    """A batch's milliseconds by the cost model. Inputs: ``driver_ms``, the driver's compute
    a batch; ``shard_ms``, each shard's; ``message_ms[k]``, a batch's messages alone with k in
    flight (0: the synchronous loop's two waited messages); ``latency_ms`` each way;
    ``cores``, what the driver and the shards get of the one machine they share when they
    work at once (its effective cores: fewer than its cores where waiting processes spin), or
    None (each on a machine of its own).

    - synchronous: the driver, then the shards (sharing the cores), then the messages and
      four latencies (two messages, each out and back);
    - depth d, K = d - 1 messages in flight: message j leaves after the reply to message
      j - K, and between them lie the driver's part, a shard's part, one message's round
      trip and two latencies, shared by K batches; no batch faster than the busiest
      process, the messages alone at K in flight, nor (one machine) all of a batch's work,
      compute and messages, spread over the cores."""
    S = len(shard_ms)
    shards = max(shard_ms) * (max(1.0, S / cores) if cores else 1.0)
    if depth == 1:
        return driver_ms + shards + message_ms[0] + 4 * latency_ms
    K = depth - 1
    cycle = (driver_ms + shards + message_ms[1] + 2 * latency_ms) / K
    # the messages alone, at the most in flight measured up to K
    alone = message_ms[max(k for k in message_ms if 0 < k <= K)]
    bounds = [cycle, driver_ms, max(shard_ms), alone]
    if cores:
        bounds.append((driver_ms + sum(shard_ms) + message_ms[0]) / cores)
    return max(bounds)


def fit_effective_cores(rows, costs, messages, cores):
    """The effective cores (1 .. ``cores``, in steps of 0.05) whose predictions have the
    smallest largest relative error on ``rows``' sharded points."""
    grid = np.arange(1.0, cores + 1e-9, 0.05)
    worst = [max(abs(p - g) / g for _, g, p in model_points(rows, costs, messages, c))
             for c in grid]
    return float(round(grid[int(np.argmin(worst))], 2))


def _mean_inputs(inputs):
    """The cost model's inputs, (costs, messages) by shard count, each the mean over its
    measurements ``inputs``: (shards, ``compute_costs``' result, ``message_costs``' by k as
    strings)."""
    costs, messages = {}, {}
    for S in sorted({S for S, _, _ in inputs}):
        cs = [c for q, c, _ in inputs if q == S]
        ms = [m for q, _, m in inputs if q == S]
        costs[S] = {"driver_ms": float(np.mean([c["driver_ms"] for c in cs])),
                    "shard_ms": [float(v) for v in np.mean([c["shard_ms"] for c in cs], axis=0)],
                    "measurements": len(cs)}
        messages[S] = {int(k): float(np.mean([m[k] for m in ms])) for k in ms[0]}
    return costs, messages


def _ms_a_batch(r):
    return 1000.0 * r["epoch_seconds"] / (r["batches"] / r.get("epochs", 1))


def model_points(rows, costs, messages, cores):
    """(configuration, measured ms a batch (mean over seeds), predicted) for every sharded
    configuration of ``rows``; ``costs[S]``: ``compute_costs`` of S shards; ``messages[S]``:
    {k: ms a batch of the messages alone with k in flight} to S shards."""
    groups = {}
    for r in rows:
        if "error" not in r and r.get("shards") and r["shards"] in costs:
            groups.setdefault(r["config"], []).append(r)
    out = []
    for name, rs in groups.items():
        r = rs[0]
        c, m = costs[r["shards"]], messages[r["shards"]]
        pred = predict_ms(c["driver_ms"], c["shard_ms"], m, r["depth"], r["latency_ms"], cores)
        out.append((name, float(np.mean([_ms_a_batch(x) for x in rs])), pred))
    return out


def _model_md(rows, costs, messages, cores, fitted):
    how = "fitted to this run's points (`fit_effective_cores`)" if fitted else \
        "given (`--effective-cores`: fitted on another run)"
    lines = [f"\nCost model (`predict_ms`), {cores:g} effective cores, {how}; its inputs, "
             "measured in this run (ms a batch: the compute alone, in one process, by "
             "`compute_costs`; the "
             "messages alone, to idle shards on a local Ray's compiled graph, by "
             "`message_costs`)\n",
             "| shards | driver | each shard | messages: synchronous | 1 in flight | "
             "2 in flight | 4 in flight |", "|---|---|---|---|---|---|---|"]
    for S in sorted(costs):
        c, m = costs[S], messages[S]
        lines.append(f"| {S} | {c['driver_ms']:.2f} | "
                     f"{', '.join(f'{v:.2f}' for v in c['shard_ms'])} | " +
                     " | ".join(f"{m[k]:.2f}" if k in m else "-" for k in (0, 1, 2, 4)) + " |")
    lines += ["\nMeasured against predicted (ms a batch)\n",
              "| configuration | measured | predicted | error |", "|---|---|---|---|"]
    for name, got, pred in model_points(rows, costs, messages, cores):
        lines.append(f"| {name} | {got:.2f} | {pred:.2f} | {100 * (pred - got) / got:+.0f} % |")
    return "\n".join(lines) + "\n"


def cluster_md(path, batch_size=128, latencies=(0.1, 0.5), depths=(1, 3, 5)):
    """The cost model's prediction for shards on machines of their own (``predict_ms`` with
    ``cores=None``) from the inputs measured in the run of results file ``path``: samples a
    second against the shard count, the depth and the latency each way."""
    with open(path) as f:
        res = json.load(f)
    model = res["cost_model"]
    costs = {int(S): c for S, c in model["costs"].items()}
    messages = {int(S): {int(k): v for k, v in m.items()} for S, m in model["messages"].items()}
    lines = [f"\nPredicted for shards on machines of their own (`cluster_md`; the inputs of "
             f"`{Path(path).name}`, commit {res['commit']}: compute and messages as measured "
             f"there, with a network's latency added): samples a second\n",
             "| shards | latency (ms each way) | " +
             " | ".join("synchronous" if d == 1 else f"depth {d}" for d in depths) + " |",
             "|---|---|" + "---|" * len(depths)]
    for S in sorted(costs):
        for lat in latencies:
            cells = [batch_size * 1000.0 / predict_ms(costs[S]["driver_ms"], costs[S]["shard_ms"],
                                                      messages[S], d, lat) for d in depths]
            lines.append(f"| {S} | {lat:g} | " + " | ".join(f"{v:,.0f}" for v in cells) + " |")
    return "\n".join(lines) + "\n"


def _machine(common):
    d = common.machine_description()
    return (f"{d['cpu']}, {d['cores']} cores, {(d['ram_bytes'] or 0) / 2**30:.0f} GiB, "
            f"BLAS {d['blas']}")


def _ints(text):
    return [int(v) for v in text.split(",") if v.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--messages", action="store_true",
                    help="only the messages' cost: two idle shards on a local Ray, actor calls "
                         "against the compiled graph, synchronous and pipelined")
    ap.add_argument("--data", help="a real set: DIR/train.txt and DIR/test.txt (XC format)")
    ap.add_argument("--labels", type=int, default=200_000, help="synthetic set's labels")
    ap.add_argument("--n-train", type=int, default=8000)
    ap.add_argument("--n-test", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--shards", default="0,1,2,4", help="0 = the single-process engine")
    ap.add_argument("--depths", default="1", help="pipeline depths of the sharded runs")
    ap.add_argument("--backend", default="ray", choices=("ray", "local"))
    ap.add_argument("--cap-mb", type=float, default=0.0,
                    help="also run 1 and 4 shards under this per-actor RLIMIT_DATA (MB)")
    ap.add_argument("--latency-ms", default="0",
                    help="comma list: each sharded run once per simulated latency (ms each way "
                         "of every message: ShardedSlideClassifier(simulated_latency_ms))")
    ap.add_argument("--model", action="store_true",
                    help="also measure the cost model's inputs (each shard count's compute "
                         "alone, in process; its messages alone, to idle shards) and tabulate "
                         "its predictions against the measured configurations")
    ap.add_argument("--effective-cores", type=float, default=0.0,
                    help="the cost model's effective cores of this machine (from another "
                         "run's fit); default: fitted to this run's points")
    ap.add_argument("--cluster", metavar="FILE",
                    help="only the cost model's prediction for shards on machines of their own, "
                         "from the inputs in results file FILE (a --model run); appended to "
                         "distributed.md")
    ap.add_argument("--tag", default="", help="appended to the .json file's name")
    ap.add_argument("--results", default=str(RESULTS), help="where the files go")
    ap.add_argument("--timeout", type=int, default=900)
    args = ap.parse_args()
    if args.one:
        cfg = json.loads(args.one)
        if cfg.get("costs"):
            result = compute_costs(cfg)
        elif cfg.get("messages"):
            result = {str(r["in_flight"]): r["ms_per_batch"] for r in message_costs(
                n_shards=cfg["messages"], transports=("compiled graph",))}
        else:
            result = run_one(cfg)
        print("RESULT " + json.dumps(result), flush=True)
        return
    # the driver only: the measured subprocesses (--one) do not import bench.common
    from bench import common
    commit = common.git_commit()
    if args.messages:
        return _messages_md(message_costs(), args, commit, common)
    if args.cluster:
        from slide.fileio import write_text
        md = Path(args.results) / "distributed.md"
        table = cluster_md(args.cluster)
        write_text(md, md.read_text() + table)
        return print(table)
    rows = []
    base = dict(labels=args.labels, n_train=args.n_train, n_test=args.n_test,
                epochs=args.epochs, backend=args.backend,
                data=str(Path(args.data).resolve()) if args.data else None)
    latencies = [float(v) for v in args.latency_ms.split(",") if v.strip()]
    inputs = []        # (shards, compute_costs, message_costs) at each seed
    for seed in _ints(args.seeds):
        for S in _ints(args.shards):
            for depth in ([1] if S == 0 else _ints(args.depths)):
                for lat in ([0.0] if S == 0 else latencies):
                    r = _sub({**base, "seed": seed, "shards": S, "depth": depth,
                              "latency_ms": lat}, args.timeout)
                    r.update(config=_config_name(S, args.backend, depth, lat), seed=seed,
                             shards=S, depth=depth, latency_ms=lat, epochs=args.epochs,
                             commit=commit)
                    print(r, flush=True)
                    rows.append(r)
        if args.model:
            # the cost model's inputs, measured at every seed beside its runs (this machine's
            # speed drifts over minutes)
            for S in sorted({S for S in _ints(args.shards) if S}):
                got = (_sub({**base, "seed": seed, "shards": S, "costs": True,
                             "epochs": max(2, args.epochs)}, args.timeout),
                       _sub({"messages": S}, args.timeout))
                for g in got:
                    if "error" in g:
                        raise RuntimeError(f"the cost model's inputs, {S} shards: {g['error']}")
                inputs.append((S, *got))
                print(S, *got, flush=True)
    if args.cap_mb:
        for S in (1, 4):
            r = _sub({**base, "seed": 0, "shards": S, "cap": int(args.cap_mb * 2**20)},
                     args.timeout)
            r["config"] = f"{S} shard{'s' * (S > 1)}, RLIMIT_DATA {args.cap_mb:.0f} MB per actor"
            r["commit"] = commit
            print(r, flush=True)
            rows.append(r)
    from slide.fileio import write_text
    name = Path(args.data).name if args.data else str(args.labels)
    title = f"{Path(args.data).name} ({args.data})" if args.data else \
        f"{args.labels:,} labels, {args.n_train:,} training points"
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    md = out / "distributed.md"
    old = md.read_text() if md.exists() else \
        "# Label-sharded training on Ray (bench/distributed.py)\n"
    table = _md(title, rows, args, commit)
    model = None
    if args.model:
        costs, messages = _mean_inputs(inputs)
        cores = args.effective_cores or fit_effective_cores(rows, costs, messages,
                                                            os.cpu_count())
        table += _model_md(rows, costs, messages, cores, not args.effective_cores)
        model = {"costs": costs, "messages": messages, "effective_cores": cores,
                 "fitted": not args.effective_cores,
                 "points": model_points(rows, costs, messages, cores)}
    write_text(out / f"distributed_{name}{args.tag}.json",
               json.dumps({"commit": commit, "runs": rows, "cost_model": model}, indent=1))
    write_text(md, old + table)
    print(table)


if __name__ == "__main__":
    main()
