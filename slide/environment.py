"""What a run's speed depends on, outside slide's own code: the versions, Numba's threads and
threading layer, the vectors' width the kernels compile to, and the BLAS kernels the shared
block's products run (``show_versions()``; ``slide info`` on the command line).

The BLAS kernel matters most and is the easiest to get wrong without noticing. slide's products
call scipy's OpenBLAS, which picks the kernel for the CPU unless ``OPENBLAS_CORETYPE`` names one.
Some hosts set it for older OpenBLAS builds that misbehaved on newer CPUs (this project's VM sets
``Haswell``: AVX2 kernels on an AVX-512 CPU), and then the products run at the named kernel's
speed: 1.8x as long as with OpenBLAS's own choice at the Debian 133k-label set's shape
(``bench/results/blas_kernels_bafb825.md``), 6-11 % of the network's training time
(``bench/results/tf_sampled_seeds_*_afd06c4_{skylakex,haswell}/summary.md``).
"""
import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version

import numba
import numpy as np
import scipy
import scipy.linalg.cython_blas  # noqa: F401  (loads scipy's OpenBLAS, the one slide calls)
import sklearn
from threadpoolctl import threadpool_info

from slide.kernels.codegen import target_cpu_name, vector_width
from slide.kernels.threads import TBB_PATH, layer_warning


def _slide_version():
    try:
        return version("slide")
    except PackageNotFoundError:          # run from a source tree that pip did not install
        return "not installed"


def cpu_model():
    """The CPU's model name (Linux's /proc/cpuinfo; elsewhere what platform tells)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _threading_layer():
    """Numba's threading layer if a parallel loop has chosen it, else the one it will choose
    (TBB when slide found its library, ``slide.kernels.threads``)."""
    try:
        return numba.threading_layer()
    except ValueError:
        chosen = os.environ.get("NUMBA_THREADING_LAYER", "default").lower()
        if chosen not in ("default", "safe"):
            return f"{chosen} (not started yet)"
        return "tbb (not started yet)" if TBB_PATH else "omp or workqueue: no tbb found"


def blas_libraries():
    """The BLAS libraries this process has loaded: name, version, kernel, threads, file."""
    return [{"library": d.get("internal_api"), "version": d.get("version"),
             "kernel": d.get("architecture"), "threads": d.get("num_threads"),
             "file": os.path.basename(d.get("filepath") or "")}
            for d in threadpool_info() if d.get("user_api") == "blas"]


def notes(info):
    """Advice on what ``info`` (``system_info()``) shows: settings that slow training."""
    out = []
    core = info["openblas_coretype"]
    if core:
        out.append(f"OPENBLAS_CORETYPE={core} pins OpenBLAS's kernel; the shared block's products "
                   "run at its speed (1.8x as long on Haswell's AVX2 kernels as on OpenBLAS's own "
                   "AVX-512 choice on an AMD EPYC). Unless your OpenBLAS build needs it, unset it "
                   "(and OPENBLAS_L2_SIZE) before starting Python.")
    layer = info["threading_layer"].split()[0]
    message = layer_warning(int(info["numba_threads"]), layer)
    if message is not None:
        out.append(message)
    return out


def system_info():
    """A dict of everything ``show_versions`` prints."""
    info = {"slide": _slide_version(), "python": platform.python_version(),
            "platform": platform.platform(), "cpu": cpu_model(), "cpu_target": target_cpu_name(),
            "cores": os.cpu_count(),
            "numpy": np.__version__, "scipy": scipy.__version__, "numba": numba.__version__,
            "scikit-learn": sklearn.__version__, "numba_threads": numba.get_num_threads(),
            "threading_layer": _threading_layer(), "vector_width": vector_width(),
            "blas": blas_libraries(),
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE") or None}
    info["notes"] = notes(info)
    return info


def format_info(info):
    """``system_info()`` as the lines ``show_versions`` prints."""
    lines = [f"{k + ':':17s}{info[k]}" for k in
             ("slide", "python", "platform", "cpu", "cpu_target", "cores", "numpy", "scipy",
              "numba", "scikit-learn", "numba_threads", "threading_layer", "vector_width")]
    for b in info["blas"]:
        lines.append(f"{'blas:':17s}{b['library']} {b['version']}, kernel {b['kernel']}, "
                     f"{b['threads']} threads ({b['file']})")
    lines.append(f"OPENBLAS_CORETYPE: {info['openblas_coretype'] or 'unset'}")
    lines += [f"note: {n}" for n in info["notes"]]
    return lines


def show_versions(file=None):
    """Print what a run's speed depends on (versions, threads, vector width, BLAS kernels) and
    advice on settings that slow training: the first thing to attach to a speed report."""
    print("\n".join(format_info(system_info())), file=file or sys.stdout)
