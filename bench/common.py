"""Shared machinery of the comparison benchmarks: data preparation, evaluation, timing, memory.

Every system (slide and each baseline) trains in its own subprocess, started by
:func:`run_in_subprocess`, which runs ``python -m bench.worker SPEC.json`` (``bench/worker.py``
picks the system's runner; this module imports none of them). The parent prepares the data once
(:func:`prepare_data`: generate or read, shuffle once with a fixed seed, save as ``.npz``), so
every system reads exactly the same arrays, and the child process measures its own peak resident
memory (``getrusage``' high-water mark, so nothing in between samples is missed).

Timing rule, identical for every system: *training seconds* run from the moment training starts
(for slide: the call to ``fit``, so building its hash tables counts; for the dense baselines: the
first batch, model variables already allocated and the training step already traced/run once on a
throw-away batch; for the label trees: the call that fits the model) to the end of the last batch,
**minus** every evaluation, which is timed separately and excluded. One-time compilation is
excluded for every system alike: slide's Numba kernels by a throw-away warm-up fit on a tiny
problem, TensorFlow's ``tf.function`` tracing by one step on a real batch whose effect on the
weights and optimiser state is then undone (``bench/dense_loop.py``).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CACHE = REPO / "bench" / "out" / "cache"
SYSTEMS = ("slide", "slide_lsh", "slide_dense", "tf", "tf_sampled", "torch", "torch_sampled",
           "omikuji", "omikuji_bonsai", "napkinxc")
BASELINES = ("tf", "tf_sampled", "torch", "torch_sampled", "omikuji", "omikuji_bonsai",
             "napkinxc")
# the baselines that draw a batch's shared negatives (--num-sampled, --candidate-sampler, ...)
SAMPLED = ("tf_sampled", "torch_sampled")
# label trees fit in one call: no batches, no epochs, no training curve
ONE_SHOT = ("omikuji", "omikuji_bonsai", "napkinxc")
LABELS = {
    "slide": "slide (sampled softmax)",
    "slide_lsh": "slide, LSH sampler (sampler='vanilla')",
    "slide_dense": "slide, full softmax (sampler='dense')",
    "tf": "TensorFlow-CPU, full softmax",
    "tf_sampled": "TensorFlow-CPU, sampled softmax",
    "torch": "PyTorch-CPU, full softmax",
    "torch_sampled": "PyTorch-CPU, sampled softmax (TF's recipe)",
    "omikuji": "Omikuji (Parabel-like label tree)",
    "omikuji_bonsai": "Omikuji (Bonsai-like label tree)",
    "napkinxc": "napkinXC PLT (label tree)",
}
KS = (1, 3, 5)
# Jain et al. (2016) propensity constants of every PSP@k here (slide.metrics' defaults), from
# the training labels of the prepared split: identical for every system
PROPENSITY_A, PROPENSITY_B = 0.55, 1.5
# test hook: seconds every evaluation sleeps (counted as evaluation time), so the smoke test can
# check that no system's training clock includes an evaluation
EVAL_PAUSE_ENV = "SLIDE_BENCH_EVAL_PAUSE"


# --------------------------------------------------------------------------------- machine info

def git_commit():
    """The commit measured (with a ``+dirty`` mark when tracked files differ from it)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=REPO,
                              capture_output=True, text=True, check=True).stdout.strip()
        # the results files are what a run writes, not what it runs: they do not make it dirty
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no",
                                "slide", "bench", ":(exclude)bench/results"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine_description():
    """CPU model (with LLVM's name for its generation, which a VM's model name may hide), core
    count and RAM of this machine, as the README reports them."""
    from slide.environment import cpu_model
    from slide.kernels.codegen import target_cpu_name
    model = f"{cpu_model()}, {target_cpu_name()}"
    ram = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                ram = int(line.split()[1]) * 1024
                break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "ram_bytes": ram,
            "python": platform.python_version(), "platform": platform.platform(),
            "blas": blas_kernels()}


def blas_kernels():
    """Which OpenBLAS kernels this environment runs, e.g. ``SkylakeX (0.3.30), SkylakeX
    (0.3.31); OPENBLAS_CORETYPE unset``: numpy's and scipy's libraries (slide's products go
    through scipy's; ``slide.environment``, which ``slide info`` prints). Some hosts set
    OPENBLAS_CORETYPE=Haswell for older builds, which runs AVX2 kernels on an AVX-512 CPU: the
    block's products took 1.8x as long at debcontents' shape
    (bench/results/blas_kernels_bafb825.md). A figure is only comparable under the same kernels."""
    from slide.environment import blas_libraries
    libs = [f"{b['kernel']} ({b['version']})" for b in blas_libraries()
            if b["library"] == "openblas"]
    core = os.environ.get("OPENBLAS_CORETYPE")
    return (", ".join(sorted(libs)) or "no OpenBLAS") + "; OPENBLAS_CORETYPE " + (
        f"= {core}" if core else "unset")


# ----------------------------------------------------------------------------------- memory

def peak_rss_bytes():
    """Peak resident set size of this process so far (kernel high-water mark, Linux: KiB)."""
    import resource
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) * (1 if sys.platform == "darwin" else 1024)


def current_rss_bytes():
    """Resident set size now (psutil when installed, else /proc/self/statm)."""
    try:
        import psutil
        return int(psutil.Process().memory_info().rss)
    except ImportError:
        try:
            pages = int(Path("/proc/self/statm").read_text().split()[1])
            return pages * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            return None


# ------------------------------------------------------------------------------------- data

def _file_digest(path):
    try:
        return hashlib.sha1(Path(path).read_bytes()).hexdigest()[:12]
    except OSError:
        return "none"


def data_key(data, scale, n_train, n_test, seed, overrides=None):
    """Cache key of a prepared data set. For presets it includes a digest of the generator's
    source, so that a changed generator never silently reuses stale data (or baseline results)."""
    if _is_preset(data):
        origin = "preset:" + _file_digest(REPO / "slide" / "synthetic.py")
    else:
        # a path: its files' sizes and modification times, so regenerated files are never
        # mistaken for the cached ones
        parts = [str(Path(data).resolve())]
        for f in _data_files(data):
            st = Path(f).stat()
            parts.append(f"{Path(f).name}:{st.st_size}:{int(st.st_mtime)}")
        origin = "path:" + "|".join(parts)
    raw = json.dumps([data, float(scale), n_train, n_test, int(seed), origin]
                     + ([sorted(overrides.items())] if overrides else []))
    return hashlib.sha1(raw.encode()).hexdigest()[:16]


def _is_preset(data):
    if Path(data).exists() or ("," in data and all(Path(f).exists() for f in data.split(","))):
        return False
    from slide.synthetic import PRESETS
    if data not in PRESETS:
        raise ValueError(f"--data {data!r} is neither an existing path nor a preset "
                         f"({', '.join(sorted(PRESETS))})")
    return True


def _data_files(data):
    if "," in data and not Path(data).exists():
        return data.split(",", 1)
    return Path(data) / "train.txt", Path(data) / "test.txt"


def _read_path(data):
    """Train and test splits from a directory holding train.txt/test.txt (XC format) or a
    'TRAIN,TEST' pair of XC files."""
    from slide.data import read_xc
    tr, te = _data_files(data)
    X_tr, Y_tr = read_xc(tr)
    X_te, Y_te = read_xc(te)
    n_lab = max(Y_tr.shape[1], Y_te.shape[1])
    n_feat = max(X_tr.shape[1], X_te.shape[1])
    X_tr.resize((X_tr.shape[0], n_feat))
    X_te.resize((X_te.shape[0], n_feat))
    Y_tr.resize((Y_tr.shape[0], n_lab))
    Y_te.resize((Y_te.shape[0], n_lab))
    return X_tr, Y_tr, X_te, Y_te


def _canonical(M, dtype=np.float32):
    M = sp.csr_matrix(M, dtype=dtype)
    M.sort_indices()
    M.indices = M.indices.astype(np.int32, copy=False)
    M.indptr = M.indptr.astype(np.int64 if M.nnz > 2**31 - 1 else np.int32, copy=False)
    return M


def prepare_data(data, scale=1.0, n_train=None, n_test=None, seed=0, cache_dir=DEFAULT_CACHE,
                 log=print, overrides=None):
    """Generate (preset) or read (path) the data once, shuffle train and test once with ``seed``,
    keep the first ``n_train`` / ``n_test`` rows, and save them to ``cache_dir/data-KEY/``.

    ``overrides`` sets other generator parameters of a preset (e.g. ``n_labels`` for the
    scaling sweep). Returns a dict with the file paths, the key and the data set's statistics. A
    second call with the same arguments reuses the saved files."""
    key = data_key(data, scale, n_train, n_test, seed, overrides)
    d = Path(cache_dir) / f"data-{key}"
    meta_path = d / "meta.json"
    if meta_path.exists():
        return json.loads(meta_path.read_text())
    t0 = time.perf_counter()
    if _is_preset(data):
        from slide.synthetic import generate
        over = dict(overrides or {})
        if n_train is not None:
            over["n_train"] = int(n_train)
        if n_test is not None:
            over["n_test"] = int(n_test)
        log(f"[data] generating preset {data} (scale={scale}, {over}, seed={seed}) ...")
        X_tr, Y_tr, X_te, Y_te = generate(data, scale=scale, seed=seed, **over)
    else:
        if scale != 1.0 or overrides:
            raise ValueError("--scale and generator overrides apply to presets only; use "
                             "--n-train/--n-test for files")
        log(f"[data] reading {data} ...")
        X_tr, Y_tr, X_te, Y_te = _read_path(data)
    # Shuffle once with a fixed seed: XC files are sorted by label, and every system must see the
    # same points in the same roles (the evaluation sample is the first rows of the shuffled test).
    rng = np.random.default_rng([int(seed), 7919])
    p_tr = rng.permutation(X_tr.shape[0])
    p_te = rng.permutation(X_te.shape[0])
    if n_train is not None:
        p_tr = p_tr[:int(n_train)]
    if n_test is not None:
        p_te = p_te[:int(n_test)]
    X_tr, Y_tr = _canonical(X_tr[p_tr]), _canonical(Y_tr[p_tr])
    X_te, Y_te = _canonical(X_te[p_te]), _canonical(Y_te[p_te])
    d.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, M in (("X_train", X_tr), ("Y_train", Y_tr), ("X_test", X_te), ("Y_test", Y_te)):
        files[name] = str(d / f"{name}.npz")
        sp.save_npz(files[name], M, compressed=False)
    label_counts = np.diff(Y_tr.indptr)
    meta = {
        "key": key, "data": data, "scale": float(scale), "seed": int(seed),
        "n_train": int(X_tr.shape[0]), "n_test": int(X_te.shape[0]),
        "n_features": int(X_tr.shape[1]), "n_labels": int(Y_tr.shape[1]),
        "avg_nnz": float(X_tr.nnz / max(1, X_tr.shape[0])),
        "avg_labels": float(label_counts.mean()) if len(label_counts) else 0.0,
        "max_labels": int(label_counts.max()) if len(label_counts) else 0,
        "labels_seen_in_train": int(np.unique(Y_tr.indices).size),
        "prepare_seconds": round(time.perf_counter() - t0, 2),
        "files": files,
    }
    tmp = meta_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta, indent=1))
    tmp.replace(meta_path)  # the meta file marks a complete data set: written last
    log(f"[data] {meta['n_train']} train / {meta['n_test']} test points, "
        f"{meta['n_features']} features, {meta['n_labels']} labels "
        f"({meta['prepare_seconds']} s)")
    return meta


def load_data(meta):
    f = meta["files"]
    return tuple(sp.load_npz(f[n]).tocsr() for n in ("X_train", "Y_train", "X_test", "Y_test"))


def batch_order(n_rows, batch_size, seed, epoch):
    """Row ids of each batch of one epoch: the same permutation slide uses for (seed, epoch)."""
    from slide.data import iterate_minibatches
    return iterate_minibatches(int(n_rows), int(batch_size), int(seed), int(epoch))


def label_targets(Y):
    """(row, label, 1/|y_row|) triplets of a CSR label batch: the softmax cross-entropy target
    of every method here, kept sparse (a dense label matrix is never built for the whole set)."""
    counts = np.diff(Y.indptr)
    rows = np.repeat(np.arange(Y.shape[0], dtype=np.int64), counts)
    w = (1.0 / np.maximum(counts, 1)).astype(np.float32)[rows]
    return rows, Y.indices.astype(np.int64), w


# ------------------------------------------------------------------------ initialisation

def init_dense_weights(n_features, hidden, n_labels, scheme, seed, label_counts=None,
                       n_train=None):
    """Initial weights of the dense baselines, drawn with NumPy so TF and PyTorch start from the
    *same* arrays. Returns W0 [n_features, hidden], b0, W1 [hidden, n_labels], b1 (float32).

    ``scheme`` names slide's own initialisation so every system starts at the same scale:
    ``glorot_uniform`` (U(+-sqrt(6/(fan_in+fan_out)))), ``glorot_normal``, ``he_normal``
    (N(0, 2/fan_in)) or ``normal:STD``. Biases start at zero; with the suffix ``+log_prior``
    (e.g. ``glorot_normal+log_prior``) the output biases start where slide's default
    ``output_bias_init="log_prior"`` puts them, log((count + 1) / (n_train + n_labels)), from
    ``label_counts`` (the training labels' counts) and ``n_train`` -- the dense network with
    slide's prior."""
    rng = np.random.default_rng([int(seed), 31337])
    scheme, _, bias = scheme.partition("+")
    if bias not in ("", "log_prior"):
        raise ValueError(f"unknown bias initialisation {bias!r} (known: log_prior)")

    def draw(fan_in, fan_out, shape):
        if scheme == "glorot_uniform":
            a = math.sqrt(6.0 / (fan_in + fan_out))
            return rng.uniform(-a, a, size=shape).astype(np.float32)
        if scheme == "glorot_normal":
            return (rng.standard_normal(shape, dtype=np.float32)
                    * np.float32(math.sqrt(2.0 / (fan_in + fan_out))))
        if scheme == "he_normal":
            return rng.standard_normal(shape, dtype=np.float32) * np.float32(math.sqrt(2.0 / fan_in))
        if scheme == "he_uniform":
            a = math.sqrt(6.0 / fan_in)
            return rng.uniform(-a, a, size=shape).astype(np.float32)
        if scheme.startswith("normal:"):
            return rng.standard_normal(shape, dtype=np.float32) * np.float32(float(scheme[7:]))
        raise ValueError(f"unknown init scheme {scheme!r}")

    W0 = draw(n_features, hidden, (n_features, hidden))
    W1 = draw(hidden, n_labels, (hidden, n_labels))
    b1 = np.zeros(n_labels, np.float32)
    if bias == "log_prior":
        counts = np.asarray(label_counts, np.float64)
        b1[:] = np.log((counts + 1.0) / (int(n_train) + n_labels))
    return W0, np.zeros(hidden, np.float32), W1, b1


# ---------------------------------------------------------------------------------- evaluation

def evaluate_topk(Y_true, topk, inv_propensity=None):
    """P@1/3/5 (and nDCG; PSP@k and PSnDCG@k with ``inv_propensity``) with slide.metrics: the
    one evaluation every system goes through."""
    from slide.metrics import evaluate
    return evaluate(Y_true, np.asarray(topk), ks=KS, inv_propensity=inv_propensity)


def inverse_propensities(Y_train):
    """Inverse propensities of every label from the training labels (``PROPENSITY_A/B``)."""
    from slide.metrics import inverse_propensity
    return inverse_propensity(Y_train, A=PROPENSITY_A, B=PROPENSITY_B)


def final_evaluation(spec, Y_tr, Y_te, predict_topk, X_te):
    """P@k, nDCG@k and PSP@k on the whole test split (propensities from the training labels),
    timed apart from training; None when the spec turns the final evaluation off."""
    if not spec.get("final_eval", True):
        return None
    t = time.perf_counter()
    final = evaluate_topk(Y_te, predict_topk(X_te), inverse_propensities(Y_tr))
    final["eval_seconds"] = time.perf_counter() - t
    final["propensity_A"], final["propensity_B"] = PROPENSITY_A, PROPENSITY_B
    return final


def eval_block_rows(n_labels, budget_bytes=256 << 20):
    """Rows per prediction block so one block's logits stay within ``budget_bytes``."""
    return int(max(16, min(4096, budget_bytes // (4 * max(1, n_labels)))))


class EvalSchedule:
    """When to evaluate during training: every ``every_batches`` batches, every
    ``every_seconds`` training seconds, or ``per_epoch`` times per epoch; always at the end of
    each epoch and after the last batch."""

    def __init__(self, batches_per_epoch, every_batches=None, every_seconds=None, per_epoch=None):
        self.bpe = int(batches_per_epoch)
        self.every_batches = every_batches
        self.every_seconds = every_seconds
        if every_batches is None and every_seconds is None:
            per_epoch = per_epoch or 8
            self.every_batches = max(1, math.ceil(self.bpe / per_epoch))
        self.last_eval_seconds = 0.0

    def due(self, batch_count, train_seconds, last):
        """batch_count: batches done so far (1-based); train_seconds: training time so far."""
        if last or batch_count % self.bpe == 0:
            return True
        if self.every_batches and batch_count % self.every_batches == 0:
            return True
        if self.every_seconds and train_seconds - self.last_eval_seconds >= self.every_seconds:
            return True
        return False


class Recorder:
    """Training-time bookkeeping shared by every system: per-batch end times (training seconds,
    evaluation excluded), losses, and the evaluation curve."""

    def __init__(self, schedule, X_eval, Y_eval, predict_topk, n_train, batch_size,
                 max_batches=None):
        self.schedule = schedule
        self.X_eval, self.Y_eval = X_eval, Y_eval
        self.predict_topk = predict_topk
        self.n_train, self.batch_size = n_train, batch_size
        self.max_batches = max_batches
        self.batch_end = []        # training seconds at the end of each batch
        self.losses = []
        self.curve = []
        self.eval_seconds = 0.0
        # CPU time of the whole process (all threads) during training, evaluation excluded:
        # utilisation = cpu / (seconds x threads) shows whether the run got its cores (the
        # machine is shared; a starved run reads well below 1)
        self.cpu_first = None
        self.cpu_last = None
        self.cpu_eval = 0.0

    def after_batch(self, train_seconds, loss, epoch, last=False):
        """Record one batch; evaluate when due. Returns True when ``max_batches`` is reached."""
        return self.after_batches(1, train_seconds, loss, epoch, last)

    def after_batches(self, count, train_seconds, loss, epoch, last=False):
        """Record ``count`` batches seen together at ``train_seconds`` (slide with several
        batches in flight reports once a wave of batches, ``info["batches"]``): their ends are
        spread evenly from the previous record (the clock's start for the first wave, so the
        first wave's batches carry the setup: the steady epoch time counts most of it, never
        less than its share), ``loss`` is the wave's mean. Evaluate once, after the last, when
        any of them was due. Returns True when ``max_batches`` is reached."""
        cpu = time.process_time()
        if self.cpu_first is None:
            self.cpu_first = cpu
        self.cpu_last = cpu
        before = len(self.batch_end)
        start = self.batch_end[-1] if self.batch_end else 0.0
        for i in range(1, count + 1):
            self.batch_end.append(start + (float(train_seconds) - start) * i / count)
            self.losses.append(float(loss) if loss is not None else float("nan"))
        n = len(self.batch_end)
        stop = self.max_batches is not None and n >= self.max_batches
        due = any(self.schedule.due(m, train_seconds, (last or stop) and m == n)
                  for m in range(before + 1, n + 1))
        if self.X_eval is not None and due:
            self.evaluate(n, train_seconds, epoch)
        return stop

    def evaluate(self, n_batches, train_seconds, epoch):
        if self.curve and self.curve[-1]["batch"] == n_batches:
            return
        t, c = time.perf_counter(), time.process_time()
        pause = float(os.environ.get(EVAL_PAUSE_ENV) or 0.0)
        if pause > 0:
            time.sleep(pause)
        topk = self.predict_topk(self.X_eval)
        m = evaluate_topk(self.Y_eval, topk)
        dt = time.perf_counter() - t
        self.eval_seconds += dt
        dc = time.process_time() - c
        self.cpu_eval += dc
        self.schedule.last_eval_seconds = train_seconds
        self.curve.append({"batch": n_batches, "epoch": epoch,
                           "samples": min(n_batches * self.batch_size,
                                          (epoch + 1) * self.n_train),
                           "train_seconds": round(train_seconds, 4),
                           "P@1": m["P@1"], "P@3": m["P@3"], "P@5": m["P@5"],
                           "eval_seconds": round(dt, 3), "eval_cpu": round(dc, 3)})
        print(f"  [eval] batch {n_batches} epoch {epoch} t={train_seconds:.1f}s "
              f"P@1={m['P@1']:.4f} P@5={m['P@5']:.4f} (eval {dt:.1f}s)", flush=True)


def predict_in_blocks(predict_block, X, k, n_labels):
    """Top-k of every row of CSR ``X`` using ``predict_block(X_rows) -> int[n, k]`` over blocks
    small enough that one block's logits fit in a few hundred MB."""
    rows = eval_block_rows(n_labels)
    out = np.empty((X.shape[0], k), dtype=np.int64)
    for s in range(0, X.shape[0], rows):
        out[s:s + rows] = predict_block(X[s:s + rows])
    return out


def samples_done(n_batches, n_train, batch_size):
    """Samples processed by ``n_batches`` batches (the last batch of an epoch may be short)."""
    bpe = math.ceil(n_train / batch_size)
    full, rem = divmod(n_batches, bpe)
    return full * n_train + min(rem * batch_size, n_train)


# ----------------------------------------------------------------------------- subprocess

def thread_env(threads):
    """Environment of a worker: every threading runtime capped at ``threads`` before import."""
    env = dict(os.environ)
    t = str(int(threads))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                "NUMBA_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
        env[var] = t
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                     else "")
    return env


@contextlib.contextmanager
def _lock_held(lock):
    """Hold an exclusive flock(2) on the file ``lock`` (nothing when None)."""
    if not lock:
        yield
        return
    import fcntl
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def run_in_subprocess(spec, work_dir, log=print, timeout=None, lock=None):
    """Run one system in a fresh Python process; return its result dict (raises on failure,
    with the tail of its log). With ``lock`` (a file path) the process runs holding an
    exclusive flock(2) on it (the lock ``flock LOCK`` takes), so it never shares the cores with another heavy run that takes the same
    lock, while other jobs can still interleave between systems."""
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    tag = spec.get("tag") or spec["system"]
    spec = dict(spec, result_path=str(work_dir / f"{tag}.result.json"))
    spec_path = work_dir / f"{tag}.spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    log_path = work_dir / f"{tag}.log"
    Path(spec["result_path"]).unlink(missing_ok=True)
    log(f"[{tag}] training in a subprocess (log: {log_path}) ...")
    t = time.perf_counter()
    cmd = [sys.executable, "-m", "bench.worker", str(spec_path)]
    # the lock is taken here (flock(2), the same lock as the flock(1) command), so that
    # ``timeout`` counts the system's own run, never the wait for another heavy run
    with _lock_held(lock), open(log_path, "w") as lf:
        proc = subprocess.run(cmd, cwd=REPO,
                              env=thread_env(spec["threads"]), stdout=lf,
                              stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode != 0 or not Path(spec["result_path"]).exists():
        tail = "".join(log_path.read_text(errors="replace").splitlines(True)[-30:])
        raise RuntimeError(f"{tag} failed (exit {proc.returncode}); end of {log_path}:\n{tail}")
    res = json.loads(Path(spec["result_path"]).read_text())
    log(f"[{tag}] done in {time.perf_counter() - t:.1f} s wall: "
        f"{res['train_seconds']:.1f} s training, peak RSS {res['peak_rss_bytes'] / 2**30:.2f} GiB")
    return res


# ------------------------------------------------------------------------------ result helpers

def time_to_target(curve, target):
    """Training seconds at which the P@1 curve first reaches ``target``, linearly interpolated
    between the two evaluations around the crossing (the first point if it is already above).
    None when never reached."""
    prev_t, prev_p = 0.0, None
    for pt in curve:
        t, p = pt["train_seconds"], pt["P@1"]
        if p >= target:
            if prev_p is None or p == prev_p:
                return t
            return prev_t + (target - prev_p) / (p - prev_p) * (t - prev_t)
        prev_t, prev_p = t, p
    return None


def fmt_seconds(s):
    if s is None:
        return "—"
    return f"{s:.1f} s" if s < 100 else f"{s:.0f} s"


def fmt_bytes(b):
    return "—" if b is None else f"{b / 2**30:.2f} GiB"


def fmt_ratio(r):
    return "—" if r is None else f"{r:.1f}x"


def prefault(gib):
    """Touch ``gib`` GiB of fresh memory and free it; returns the seconds it took.

    On a virtual machine whose host backs guest memory lazily, the first touch of a page the
    host has taken back costs far more than the kernel's own page fault (this project's machine:
    2.3 s per GiB after 25 s of idle, 0.25-0.35 s for memory another process freed moments
    before). A system that allocates its model inside its
    clock then times the host. Freed pages go back to the kernel's free lists and are handed out
    first to the next allocation, so a process that touches and frees about its peak memory
    right before its clock starts gets pages the host already backs (TensorFlow builds its
    variables before its clock, but its allocator still grows inside it: both systems gain).

    The process's peak resident memory is then reset to what it holds (Linux's
    ``/proc/self/clear_refs``), so the peak it reports is the system's own."""
    if gib <= 0:
        return 0.0
    t = time.perf_counter()
    a = np.ones(int(gib * (1 << 30)) // 8)
    del a
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError as e:          # not Linux: the peak would include the touched memory
        raise RuntimeError(f"--prefault-gib needs /proc/self/clear_refs to reset the peak "
                           f"memory it would otherwise report ({e})") from e
    return time.perf_counter() - t


@contextlib.contextmanager
def busy_loops(n):
    """``n`` processes spinning on a core each while the body runs: another user's
    single-threaded jobs on a shared machine."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()
