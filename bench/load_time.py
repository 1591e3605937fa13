"""Load time and peak memory of ``slide.read_xc`` on an Amazon-670K-shaped file.

Writes a random file with the public Amazon-670K train shape (490,449 points, 135,909 features,
670,091 labels, ~75 nonzeros and ~5.45 labels per point; values with 6 decimals like the
repository's tf-idf files) with ``slide.write_xc``, then loads it in fresh subprocesses and
reports wall time and peak RSS above the interpreter's baseline (``VmHWM`` after the load,
reset through ``/proc/self/clear_refs`` after imports and kernel warm-up, minus ``VmRSS`` at that
point; ``ru_maxrss`` is useless here because a child inherits its parent's high-water mark),
as a ratio to the bytes of the resulting CSR
matrices (X and Y: data + indices + indptr). The baseline measured in the same run is
scikit-learn's ``load_svmlight_file(multilabel=True, zero_based=True)`` after the header.

Run heavy benchmarks serialised:  flock /tmp/slide-bench.lock python bench/load_time.py
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

from bench import common  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = r"""
import json, resource, sys, time, tempfile, os
import numpy as np
which, path = sys.argv[1], sys.argv[2]
if which == "slide":
    from slide.data import read_xc
    # warm-up: load the cached kernels on a tiny file so compilation is not measured
    tmp = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
    tmp.write("2 3 2\n0,1 0:0.5 2:1.5\n 1:1e-3\n"); tmp.close()
    read_xc(tmp.name); os.unlink(tmp.name)
    load = read_xc
else:
    from sklearn.datasets import load_svmlight_file
    import scipy.sparse as sp
    def load(p):
        with open(p, "rb") as f:
            n, d, L = (int(v) for v in f.readline().split())
            X, y = load_svmlight_file(f, multilabel=True, zero_based=True, n_features=d,
                                      dtype=np.float32)
        return X, y
def status_kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)
try:
    # reset the high-water mark: ru_maxrss (and VmHWM before a reset) can still hold the
    # parent's peak, inherited through fork + exec
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = status_kib("VmRSS")
    peak_fn = lambda: status_kib("VmHWM")
except OSError:
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak_fn = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
X, Y = load(path)
dt = time.perf_counter() - t0
peak = max(peak_fn(), base)
def nbytes(m):
    if isinstance(m, list):  # sklearn's labels: list of tuples, not a matrix
        return 0
    return m.data.nbytes + m.indices.nbytes + m.indptr.nbytes
print(json.dumps({"seconds": dt, "base_kib": base, "peak_kib": peak,
                  "x_bytes": nbytes(X), "y_bytes": nbytes(Y), "shape": list(X.shape),
                  "nnz": int(X.nnz)}))
"""


def make_data(n, d, L, avg_nnz, avg_labels, seed):
    """Random CSR X (values rounded to 6 decimals, stored as float32) and label CSR Y."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)

    def rows_of(counts, high):
        counts = np.maximum(counts, 1)
        row = np.repeat(np.arange(n, dtype=np.int64), counts)
        col = rng.integers(0, high, size=row.size, dtype=np.int64)
        key = row * high + col
        del row, col
        key.sort()
        key = key[np.concatenate(([True], key[1:] != key[:-1]))]  # duplicates removed
        row, col = key // high, (key % high).astype(np.int32)
        ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(row, minlength=n), out=ptr[1:])
        return col, ptr

    xi, xp = rows_of(rng.poisson(avg_nnz, n), d)
    xv = np.round(rng.uniform(0.001, 1.0, xi.size), 6).astype(np.float32)
    X = sp.csr_matrix((xv, xi, xp), shape=(n, d))
    yi, yp = rows_of(1 + rng.poisson(avg_labels - 1, n), L)
    Y = sp.csr_matrix((np.ones(yi.size, np.float32), yi, yp), shape=(n, L))
    return X, Y


def measure(which, path):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", _CHILD, which, path], check=True,
                         capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=490_449)
    ap.add_argument("--features", type=int, default=135_909)
    ap.add_argument("--labels", type=int, default=670_091)
    ap.add_argument("--avg-nnz", type=float, default=75.0)
    ap.add_argument("--avg-labels", type=float, default=5.45)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--path", default=os.path.join(ROOT, "datasets", "bench",
                                                   "amazon670k_shape_train.txt"))
    ap.add_argument("--repeats", type=int, default=2, help="slide loads (fresh process each)")
    ap.add_argument("--no-sklearn", action="store_true", help="skip the scikit-learn baseline")
    ap.add_argument("--reuse", action="store_true", help="reuse an existing file at --path")
    ap.add_argument("--out-md", default=None, help="also write the table to this file")
    args = ap.parse_args(argv)
    commit = common.git_commit()

    sys.path.insert(0, ROOT)
    from slide.data import write_xc

    os.makedirs(os.path.dirname(os.path.abspath(args.path)), exist_ok=True)
    gen_s = write_s = None
    if not (args.reuse and os.path.exists(args.path)):
        t0 = time.perf_counter()
        X, Y = make_data(args.points, args.features, args.labels, args.avg_nnz,
                         args.avg_labels, args.seed)
        gen_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        write_xc(args.path, X, Y)
        write_s = time.perf_counter() - t0
        del X, Y
    size = os.path.getsize(args.path)

    runs = [measure("slide", args.path) for _ in range(args.repeats)]
    base = None if args.no_sklearn else measure("sklearn", args.path)

    r0 = runs[0]
    csr = r0["x_bytes"] + r0["y_bytes"]
    import platform

    import numba
    import scipy

    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    lines = [
        "# `read_xc` load time and peak memory, Amazon-670K shape",
        "",
        "Command: `" + " ".join(["flock /tmp/slide-bench.lock python bench/load_time.py"]
                                + list(argv if argv is not None else sys.argv[1:])) + "`",
        f"Machine: {os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, "
        f"NumPy {np.__version__}, SciPy {scipy.__version__}, Numba {numba.__version__}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; commit {commit}.",
        "",
        "Peak = high-water RSS during the load minus RSS just before it, in a fresh process "
        "after imports and kernel warm-up. CSR = data + indices + indptr of X and Y.",
        "",
        f"File: {args.path if not args.path.startswith(ROOT) else os.path.relpath(args.path, ROOT)}"
        f" -- {r0['shape'][0]:,} points x {r0['shape'][1]:,} features, {args.labels:,} labels, "
        f"X nnz {r0['nnz']:,}, {size / 2**20:,.0f} MiB of text.",
        "",
    ]
    if write_s is not None:
        lines += [f"Random data generated in {gen_s:.1f} s; `write_xc` wrote it in "
                  f"{write_s:.1f} s.", ""]
    lines += [
        "| loader | run | load time (s) | peak RSS above baseline (MiB) | CSR X+Y (MiB) "
        "| peak / CSR |",
        "|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(runs):
        peak = (r["peak_kib"] - r["base_kib"]) * 1024
        lines.append(f"| slide.read_xc | {i + 1} | {r['seconds']:.2f} | {peak / 2**20:,.0f} | "
                     f"{csr / 2**20:,.0f} | {peak / csr:.2f} |")
    if base is not None:
        peak = (base["peak_kib"] - base["base_kib"]) * 1024
        lines.append(f"| sklearn load_svmlight_file (X only counted in CSR) | 1 | "
                     f"{base['seconds']:.2f} | {peak / 2**20:,.0f} | "
                     f"{base['x_bytes'] / 2**20:,.0f} | "
                     f"{peak / max(base['x_bytes'], 1):.2f} |")
        best = min(r["seconds"] for r in runs)
        lines += ["", "Target (issue 2): under 60 s and peak under 3x the CSR bytes.", "",
                  f"Speed-up of read_xc over the scikit-learn baseline (same run, same file): "
                  f"{base['seconds'] / best:.1f}x."]
    text = "\n".join(lines)
    print(text)
    if args.out_md:
        with open(args.out_md, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
