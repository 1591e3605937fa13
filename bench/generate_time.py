"""Generation time and peak memory of slide.synthetic presets.

Each measurement runs in a fresh child process so that its peak resident set size (ru_maxrss) is
its own; the child's baseline (interpreter + NumPy/SciPy + slide imported) is reported beside it.

    flock /tmp/slide-bench.lock python bench/generate_time.py amazon670k xc200k [--write DIR]

Prints one Markdown table row per preset: wall time of ``generate``, peak RSS, the size of the
four CSR matrices it returns, and the realised statistics of the training split.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _child(preset, write_dir, seed):
    import numpy as np

    from slide.synthetic import PRESETS, generate, write_dataset

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    Xtr, Ytr, Xte, Yte = generate(preset, seed=seed)
    t_gen = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t_write = None
    if write_dir:
        t0 = time.perf_counter()
        write_dataset(os.path.join(write_dir, preset), Xtr, Ytr, Xte, Yte)
        t_write = time.perf_counter() - t0
    freq = np.sort(np.bincount(Ytr.indices, minlength=Ytr.shape[1]))[::-1]
    csr_bytes = sum(M.data.nbytes + M.indices.nbytes + M.indptr.nbytes for M in (Xtr, Ytr, Xte, Yte))
    print(json.dumps(dict(
        preset=preset, seed=seed, gen_s=t_gen, write_s=t_write,
        base_rss_mb=base / 1024, peak_rss_mb=peak / 1024, csr_mb=csr_bytes / 2**20,
        shape_train=list(Xtr.shape), n_test=Xte.shape[0], n_labels=Ytr.shape[1],
        nnz_train=int(Xtr.nnz), nnz_test=int(Xte.nnz),
        nnz_per_point=Xtr.nnz / Xtr.shape[0], labels_per_point=Ytr.nnz / Ytr.shape[0],
        target_nnz=PRESETS[preset]["avg_nnz"], target_labels=PRESETS[preset]["avg_labels"],
        labels_in_train=float((freq > 0).mean()), median_label_count=float(np.median(freq)),
        mean_label_count=float(freq.mean()), max_label_count=int(freq[0]),
        top1pct_share=float(freq[: max(1, len(freq) // 100)].sum() / freq.sum()),
    )))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("presets", nargs="+")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write", default=None, help="also write train.txt/test.txt under DIR/<preset>")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        _child(a.presets[0], a.write, a.seed)
        return
    # the parent only: the measured children (--child) do not import bench.common
    from bench import common
    print(f"cpus: {os.cpu_count()}, python {sys.version.split()[0]}, "
          f"commit {common.git_commit()}")
    print("| preset | generate (s) | write (s) | peak RSS (MB) | baseline RSS (MB) | CSR size (MB) "
          "| train nnz | nnz/pt (target) | labels/pt (target) | labels seen in train "
          "| label count median / mean / max | top-1% labels' share |")
    print("|" + "---|" * 12)
    for preset in a.presets:
        cmd = [sys.executable, os.path.abspath(__file__), preset, "--child", "--seed", str(a.seed)]
        if a.write:
            cmd += ["--write", a.write]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        w = "-" if r["write_s"] is None else f"{r['write_s']:.1f}"
        print(f"| {preset} | {r['gen_s']:.1f} | {w} | {r['peak_rss_mb']:.0f} | {r['base_rss_mb']:.0f} "
              f"| {r['csr_mb']:.0f} | {r['nnz_train']:,} | {r['nnz_per_point']:.1f} ({r['target_nnz']}) "
              f"| {r['labels_per_point']:.2f} ({r['target_labels']}) | {r['labels_in_train']:.1%} "
              f"| {r['median_label_count']:.0f} / {r['mean_label_count']:.2f} / {r['max_label_count']:,} "
              f"| {r['top1pct_share']:.1%} |", flush=True)


if __name__ == "__main__":
    main()
