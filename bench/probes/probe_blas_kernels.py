"""The batched engine's three block products under each OpenBLAS kernel this machine offers:
the environment's own choice (some hosts set ``OPENBLAS_CORETYPE=Haswell``, for older builds
that compute wrong results on newer CPUs) and the library's own detection with
``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` unset. Each setting runs in a fresh process
(the variables are read when the library loads), checks the products against a float64
reference computed without BLAS (``np.einsum``), and times them one BLAS thread, the way a
task of ``slide.network.products`` calls them (Numba's sgemm entry, a part of S's columns).

    python bench/probes/probe_blas_kernels.py [--columns 512,1024] [--out FILE]
"""
import argparse
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = r"""
import sys, time, numpy as np
sys.path.insert(0, {repo!r})
from threadpoolctl import threadpool_limits
from numba import njit
from bench.common import blas_kernels
from slide.network.products import _gemm, _N, _T

@njit(nogil=True)
def three(H, WS, dZ, Z, dH, dW, reps):
    B, h = H.shape
    S = WS.shape[0]
    for r in range(reps):
        _gemm(_T, _N, S, B, h, WS.reshape(-1), h, H.reshape(-1), h, Z.reshape(-1), S)
        _gemm(_N, _N, h, B, S, WS.reshape(-1), h, dZ.reshape(-1), S, dH.reshape(-1), h)
        _gemm(_N, _T, h, S, B, H.reshape(-1), h, dZ.reshape(-1), S, dW.reshape(-1), h)

print("kernels:", blas_kernels())
rng = np.random.default_rng(0)
for S in {columns}:
    B, h = 128, 128
    H = rng.normal(size=(B, h)).astype(np.float32)
    WS = rng.normal(size=(S, h)).astype(np.float32)
    dZ = rng.normal(size=(B, S)).astype(np.float32)
    Z, dH, dW = np.zeros((B, S), np.float32), np.zeros((B, h), np.float32), np.zeros((S, h), np.float32)
    with threadpool_limits(1, user_api="blas"):
        three(H, WS, dZ, Z, dH, dW, 2)
        H64, W64, D64 = H.astype(np.float64), WS.astype(np.float64), dZ.astype(np.float64)
        err = max(np.abs(Z - np.einsum("ik,jk->ij", H64, W64)).max(),
                  np.abs(dH - np.einsum("ij,jk->ik", D64, W64)).max(),
                  np.abs(dW - np.einsum("ij,ik->jk", D64, H64)).max())
        best = np.inf
        for r in range(7):
            t = time.perf_counter()
            three(H, WS, dZ, Z, dH, dW, 100)
            best = min(best, (time.perf_counter() - t) / 100)
    print(f"| {{S}} | {{best * 1e6:.0f}} | {{6 * B * S * h / best / 1e9:.0f}} | {{err:.1e}} |")
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--columns", default="512,1024", help="columns of S in one BLAS call")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    cols = [int(c) for c in a.columns.split(",")]
    lines = ["# The block's three products (B = h = 128) by OpenBLAS kernel, one BLAS thread", "",
             f"- command: `python bench/probes/probe_blas_kernels.py --columns {a.columns}`"]
    for name, drop in (("this environment's", ()),
                       ("OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset",
                        ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"))):
        env = {k: v for k, v in os.environ.items() if k not in drop}
        out = subprocess.run([sys.executable, "-c", CHILD.format(repo=REPO, columns=cols)],
                             env=env, capture_output=True, text=True, check=True).stdout
        head, *rows = out.strip().splitlines()
        lines += ["", f"## {name}: {head.split(': ', 1)[1]}", "",
                  "| columns of S | three products, us | GFLOP/s | max abs error vs float64 |",
                  "|---|---|---|---|", *rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
