"""Write the golden fixture of the training engine: tests/data/golden.json + golden_ckpt.npz
(code compiled with 256-bit vectors) or golden_w512.json + golden_ckpt_w512.npz (512-bit: the
default on AVX-512 CPUs, ``slide.kernels.codegen``; float sums round differently).

Run from the repository root with the code whose behaviour is to be pinned, once per width:

    PYTHONPATH=$PWD python tests/make_golden.py [CASE ...]    (no case named: all of them)
    SLIDE_VECTOR_WIDTH=256 PYTHONPATH=$PWD python tests/make_golden.py [CASE ...]

Each case trains a small model through ``SlideClassifier`` (one thread, fixed seed, short
rehash/rebuild periods so both happen during the run) and records sha256 + float sums of the
final W and B, the optimizer's moments, and the top-5 predictions (exact and sparse) of a few
test rows. ``tests/test_golden.py`` retrains every case and asserts equality, so a refactor of
the engine that changes any float is caught. The bits are pinned where the code is compiled as
it was for the fixture (``codegen``: Numba's, llvmlite's and LLVM's versions, the CPU LLVM
compiles for and the vectors' width; fastmath lets LLVM choose the order of a loop's float
sums: the 256-bit fixture written on an earlier host of this project, another CPU and Numba,
differed in the last bits of every case on a later one, with the same predictions and sums
within 1.4e-7 relative). The cases that call BLAS (``BLAS_CASES``) are pinned bit for bit only under the
BLAS builds the fixture records as well (``blas``). Elsewhere a case's predictions, step
counts and schedule must still be equal and its float sums within ``CODEGEN_RTOL`` (another
compilation) or ``BLAS_RTOL`` (another BLAS build). The checkpoint file pins the on-disk
format: the current code must still load it and predict what it predicted when it was
written.
"""
import hashlib
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")


def fixture_paths(width):
    """The fixture of code compiled with ``width``-bit vectors: (json, checkpoint)."""
    suffix = "" if width <= 256 else f"_w{width}"
    return (os.path.join(DATA, f"golden{suffix}.json"),
            os.path.join(DATA, f"golden_ckpt{suffix}.npz"))


def current_width():
    """The vectors' width of this process's compiled code (importing slide decides it)."""
    import slide  # noqa: F401
    from slide.kernels.codegen import vector_width
    return vector_width()


WIDTH = current_width()
GOLDEN_JSON, GOLDEN_CKPT = fixture_paths(WIDTH)

# a small shape: 400 features, 200 labels, 600 training points -> 10 batches of 64 per epoch
SHAPE = dict(n_features=400, n_train=600, n_test=40)
N_ROWS = 8          # test rows whose predictions are pinned
BASE = dict(hidden_sizes=(16,), K=2, L=8, range_pow=6, bucket_size=16, sampler_budget=48,
            shared_negatives=24, exact_head=0.0, min_active=40, batch_size=64, epochs=2, rehash_period=3,
            rebuild_period=7, rehash_decay=0.0, learning_rate=3e-3, lr_schedule="constant",
            n_threads=1,
            random_state=0,
            # the fixture pins the engine (network, optimizer, tables): predictions without
            # the neighbour vote, which tests/test_neighbours.py covers
            neighbours=0,
            # the per-sample engine is the reference every case was recorded with; the
            # batched one (the default since round 3) has its own cases below
            engine="per_sample")
# Every case names its sampler: the fixture was recorded when the engine's default was
# "vanilla" (the default is "random" since issue 14), and a case keeps what it recorded.
CASES = {
    "default": dict(sampler="vanilla"),
    "batched": dict(sampler="random", engine="batched"),
    "batched_vanilla": dict(sampler="vanilla", engine="batched"),
    "random": dict(sampler="random"),
    "dense": dict(sampler="dense"),
    "sigmoid": dict(loss="sigmoid", sampler="vanilla"),
    "sigmoid_random": dict(loss="sigmoid", sampler="random"),
    "simhash": dict(hash_family="simhash", sampler="vanilla"),
    "wta": dict(hash_family="wta", sampler="vanilla"),
    "dwta_reservoir": dict(hash_family="dwta", bucket_policy="reservoir", bucket_size=3,
                           sampler="vanilla"),
    "doph": dict(hash_family="doph", sampler="vanilla"),
    "topk": dict(sampler="topk"),
    "threshold": dict(sampler="threshold"),
    "uniform_negatives": dict(negative_power=0.0, sampler="vanilla"),
    "no_correction": dict(sampling_correction=False, sampler="vanilla"),
    "lazy_adam": dict(optimizer="lazy_adam", sampler="vanilla"),
    "sgd": dict(optimizer="sgd", learning_rate=0.05, sampler="vanilla"),
    "two_sparse_layers": dict(hidden_sizes=(16, 24), sparse_layers=(1, 2), sampler="vanilla"),
}

# the cases whose floats pass through BLAS (the batched engine's products, the dense output
# layer): their bits depend on the OpenBLAS build numpy and scipy ship, which a fresh install
# may update (scipy's 0.3.30 moved these cases' sums by ~1e-7 relative)
BLAS_CASES = ("batched", "batched_vanilla", "dense")
# how close those cases' float sums must stay under another BLAS build (relative)
BLAS_RTOL = 1e-5
# how close every case's float sums must stay where the kernels were compiled for another CPU
# or by another Numba/LLVM (relative; 1.4e-7 measured between two hosts' 256-bit fixtures)
CODEGEN_RTOL = 1e-6


def codegen_build():
    """What decides the compiled kernels' float bits besides slide's code: Numba's, llvmlite's
    and LLVM's versions, the CPU LLVM compiles for and the vectors' width. The fixture records
    it; its bits are pinned only under it."""
    import llvmlite
    import llvmlite.binding as ll
    import numba
    from numba.core import config
    cpu = config.CPU_NAME or ll.get_host_cpu_name()
    llvm = ".".join(str(v) for v in ll.llvm_version_info)
    return (f"numba {numba.__version__} llvmlite {llvmlite.__version__} llvm {llvm} cpu {cpu} "
            f"width {WIDTH}")


def blas_builds():
    """The BLAS libraries this process has loaded (threadpoolctl): "api version file kernel"
    each, sorted; the fixture records them, and a BLAS case's bits are pinned only under them.
    The kernel counts: one OpenBLAS build runs other kernels on another CPU, or where
    OPENBLAS_CORETYPE names one (some hosts set Haswell), and they round differently."""
    import scipy.linalg  # noqa: F401  (loads scipy's OpenBLAS, the one the products call)
    from threadpoolctl import threadpool_info
    return sorted(f"{i.get('internal_api')} {i.get('version')} "
                  f"{os.path.basename(i.get('filepath', ''))} {i.get('architecture')}"
                  for i in threadpool_info() if i.get("user_api") == "blas")


def data():
    from slide import generate
    return generate("tiny", seed=3, **SHAPE)


def digest(a):
    a = np.ascontiguousarray(a)
    return {"sha256": hashlib.sha256(a.tobytes()).hexdigest(), "sum": float(a.astype(np.float64).sum())}


def tables_top5(model, Xq):
    """Top-5 through the TRAINING tables (the LSH-selected neurons plus the 256 highest-bias
    ones; exact top-5 for a model without tables): what ``predict_topk(exact=False)`` returned
    when the fixture was recorded. Sparse serving now has its own index
    (``slide.kernels.lsh.serving``, tested in tests/test_serving.py); this keeps pinning the state of
    the tables that training leaves behind."""
    from slide.network.trainer import blas_single_thread
    model.sync()
    net = model.network_
    with blas_single_thread():
        if not net.uses_tables:
            return net.predict_topk_exact(Xq, 5)
        model._ensure_lsh()
        return net.predict_topk_sparse(Xq, 5, call=0, prior_candidates=256)


def fingerprint(model, X_test):
    """What a case pins: parameters, optimizer moments and predictions."""
    Xq = X_test[:N_ROWS]
    exact = model.predict_topk(Xq, k=5, exact=True)
    sparse = tables_top5(model, Xq)
    net, opt = model.network_, model.optimizer_
    return {"W": digest(net.W), "B": digest(net.B), "MW": digest(opt.MW), "VW": digest(opt.VW),
            "MB": digest(opt.MB), "VB": digest(opt.VB), "t": int(opt.t),
            "schedule": [int(v) for v in model.schedule_.state()],
            "top5_exact": exact.tolist(), "top5_sparse": sparse.tolist()}


def train_case(name, X, Y):
    from slide import SlideClassifier
    params = dict(BASE, **CASES[name])
    return SlideClassifier(**params).fit(X, Y)


def resumed_digest(X, Y):
    """W after one more epoch trained from the checkpoint file (pins how a load resumes)."""
    import slide
    model = slide.load(GOLDEN_CKPT)
    model.partial_fit(X, Y)
    model.sync()
    return digest(model.network_.W)


def main(only=()):
    """Regenerate every case, or only the cases named in ``only`` (the others, and the
    checkpoint unless "default" is named, are kept from the current fixture)."""
    os.makedirs(DATA, exist_ok=True)
    X, Y, X_test, _ = data()
    base = {k: list(v) if isinstance(v, tuple) else v for k, v in BASE.items()}
    out = {"vector_width": WIDTH, "codegen": codegen_build(), "blas": blas_builds(),
           "shape": SHAPE, "base": base, "cases": {}}
    unknown = [name for name in only if name not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; cases: {list(CASES)}")
    if only:
        with open(GOLDEN_JSON) as f:
            out = json.load(f)
        if out.get("codegen") != codegen_build() and sorted(only) != sorted(CASES):
            raise SystemExit(f"this compilation ({codegen_build()}) is not the fixture's "
                             f"({out.get('codegen')}): regenerate every case together")
        if out.get("blas") != blas_builds() and any(n in BLAS_CASES for n in only) \
                and not all(n in only for n in BLAS_CASES):
            raise SystemExit(f"this BLAS ({blas_builds()}) is not the fixture's "
                             f"({out.get('blas')}): regenerate all of {BLAS_CASES} together")
        out["blas"] = blas_builds() if any(n in BLAS_CASES for n in only) else out.get("blas")
    for name in (only or CASES):
        model = train_case(name, X, Y)
        out["cases"][name] = fingerprint(model, X_test)
        if name == "default":
            model.save(GOLDEN_CKPT)
            out["checkpoint"] = {"top5_exact": out["cases"][name]["top5_exact"],
                                 "top5_sparse": out["cases"][name]["top5_sparse"],
                                 "resumed_W": resumed_digest(X, Y)}
        print(name, out["cases"][name]["W"]["sum"], file=sys.stderr)
    with open(GOLDEN_JSON, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(tuple(sys.argv[1:]))
