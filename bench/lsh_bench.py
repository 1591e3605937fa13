"""LSH subsystem benchmark at the Amazon-670K output layer's shape (670,091 neurons x 128 inputs).

For each hash family: build and rehash time of the L tables, index memory, and per query the time
of hash + table lookup + sampling (one thread, called from njit code exactly as the training
engine does), against computing all 670,091 inner products densely with numpy (one query, and a
batch of queries), printed as a ratio, with the recall of the true top-10 beside it.

Weights: a *planted* matrix -- background rows ~ N(0, I/dim) (inner products with a unit query
have sd 0.088, max over 670k ~ 0.45) plus, for each query, 10 rows at an angle of 0.3..1.0 rad
from it (inner products 0.54..0.96), which are then exactly the true top-10 (checked by the
dense product). Queries are ReLU'd Gaussian vectors, like hidden activations.

Run (serialised with the other benchmarks):
    flock /tmp/slide-bench.lock .venv/bin/python bench/lsh_bench.py --out bench/results/lsh.md
"""
import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numba
import numpy as np
from numba import njit

from slide.kernels.rng import stream_seed
from slide.kernels.lsh import LSHIndex, hash_dense_into, sample_into, scratch_sizes
from slide.kernels.lsh.samplers import SAMPLERS

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common  # noqa: E402


def planted(N, dim, nq, seed=0):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((N, dim), dtype=np.float32)
    W *= np.float32(1 / np.sqrt(dim))
    Q = np.maximum(rng.standard_normal((nq, dim)), 0)
    Q /= np.linalg.norm(Q, axis=1, keepdims=True)
    ids = rng.choice(N, nq * 10, replace=False).reshape(nq, 10)
    for q in range(nq):
        th = rng.uniform(0.3, 1.0, 10)
        Z = rng.standard_normal((10, dim))
        Z -= (Z @ Q[q])[:, None] * Q[q][None, :]
        Z /= np.linalg.norm(Z, axis=1, keepdims=True)
        W[ids[q]] = np.cos(th)[:, None] * Q[q][None, :] + np.sin(th)[:, None] * Z
    return W, Q.astype(np.float32), ids


@njit(cache=True, nogil=True, fastmath=True)
def lsh_queries(fam, K, L, bits, intp, floatp, offsets, items, n_neurons, sampler, budget,
                threshold, Q, W, set_keys, set_counts, order, out, counts, codes, with_products):
    """Per query: hash, look up the L buckets, sample (and optionally score the active set)."""
    forced = np.zeros(0, np.int32)
    acc = 0.0
    for i in range(Q.shape[0]):
        hash_dense_into(fam, K, L, bits, intp, floatp, Q[i], codes)
        state = stream_seed(12345, 1, i)
        n, state = sample_into(sampler, codes, offsets, items, n_neurons, budget, threshold,
                               forced, 0, state, set_keys, set_counts, order, out[i])
        counts[i] = n
        if with_products:
            for a in range(n):
                r = out[i, a]
                s = np.float32(0.0)
                for d in range(W.shape[1]):
                    s += W[r, d] * Q[i, d]
                acc += s
    return acc


def median_time(fn, reps):
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=670_091)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64, help="queries per dense batch matmul")
    ap.add_argument("--out", default=None, help="write a markdown report here")
    args = ap.parse_args()
    commit = common.git_commit()
    N, dim, nq = args.n, args.dim, args.queries
    lines = []

    def say(s=""):
        print(s, flush=True)
        lines.append(s)

    t0 = time.perf_counter()
    W, Q, planted_ids = planted(N, dim, nq)
    say(f"# LSH benchmark: {N:,} neurons x {dim}, {nq} queries")
    say()
    say(f"Machine: {platform.processor() or platform.machine()}, {numba.config.NUMBA_NUM_THREADS} numba "
        f"threads, numpy {np.__version__}, numba {numba.__version__}, "
        f"commit {commit}. Command: "
        f"`flock /tmp/slide-bench.lock .venv/bin/python bench/lsh_bench.py {' '.join(sys.argv[1:])}`")
    say()
    say(f"Load average at start (the machine is shared; other jobs inflate timings): "
        f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    say()
    say("Weights: planted (background rows ~ N(0, I/dim); per query 10 rows at 0.3..1.0 rad, which are the "
        "true top-10). Queries: ReLU'd Gaussian, unit norm.")
    say()

    # dense baseline: all inner products, then the top-10 (numpy, BLAS threads as configured)
    S = Q @ W.T
    top = np.argpartition(-S, 10, axis=1)[:, :10]
    assert all(set(top[q]) == set(planted_ids[q]) for q in range(nq)), "planted rows are not the top-10"
    del S
    t_dense1 = median_time(lambda: W @ Q[0], 7)
    t_dense1_top = median_time(lambda: np.argpartition(-(W @ Q[0]), 10)[:10], 7)
    Qb = Q[: args.batch]
    t_denseb = median_time(lambda: Qb @ W.T, 3) / len(Qb)
    try:
        from threadpoolctl import threadpool_info
        blas = ", ".join(f"{d['internal_api']} {d['num_threads']} threads" for d in threadpool_info()
                         if d.get("user_api") == "blas")
    except Exception:  # threadpoolctl is optional
        blas = "BLAS threads unknown"
    try:
        from threadpoolctl import threadpool_limits
        with threadpool_limits(1):
            t_dense1_1t = median_time(lambda: W @ Q[0], 7)
            t_denseb_1t = median_time(lambda: Qb @ W.T, 3) / len(Qb)
        one_thread = (f" With 1 BLAS thread (the LSH path below uses one thread): W @ q {t_dense1_1t * 1e3:.2f} ms,"
                      f" batched {t_denseb_1t * 1e3:.3f} ms per query.")
    except Exception:
        one_thread = ""
    say(f"Dense baseline ({blas}): W @ q {t_dense1 * 1e3:.2f} ms per query; with top-10 selection "
        f"{t_dense1_top * 1e3:.2f} ms; batched ({len(Qb)} queries, Q @ W.T) {t_denseb * 1e3:.3f} ms per query."
        + one_thread + " Ratios below use the default-thread figures.")
    say()

    configs = [("dwta", 6, 50, 18), ("simhash", 12, 50, 18), ("simhash", 16, 50, 18), ("doph", 6, 50, 18)]
    samplers = [("vanilla", 2000, 1), ("topk", 2000, 1), ("threshold", 2000, 2)]
    say("| family | K | L | R | build s | rehash s | index MB | sampler | active mean | hash+query+sample us/query "
        "| vs W@q (1 query) | vs batched matmul | + score active us | recall@10 | random set recall |")
    say("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for fam, K, L, R in configs:
        idx = LSHIndex(fam, dim, K, L, R, bucket_size=128, policy="fifo", seed=1)
        idx.build(W[:1000])  # compile outside the timing
        t = time.perf_counter()
        idx.build(W)
        t_build = time.perf_counter() - t
        W2 = W + np.float32(0.01) * np.random.default_rng(1).standard_normal(W.shape, dtype=np.float32)
        t = time.perf_counter()
        idx.rehash(W2)
        t_rehash = time.perf_counter() - t
        del W2
        idx.build(W)
        mem = idx.memory_bytes() / 1e6
        sizes = np.diff(idx.offsets, axis=1)
        occupied = sizes[sizes > 0]
        hf = idx.hf
        for sampler, budget, thr in samplers:
            sz = scratch_sizes(sampler, L, 128, budget, 0, 0)
            sk = np.full(sz["set_size"], -1, np.int32)
            sc = np.zeros(sz["set_size"], np.int32)
            order = np.zeros(sz["order_size"], np.int32)
            out = np.full((nq, sz["capacity"]), -1, np.int32)
            counts = np.zeros(nq, np.int32)
            codes = np.zeros(L, np.int32)
            code = SAMPLERS[sampler]
            run = lambda prod: lsh_queries(hf.family_code, K, L, hf.bits, hf.int_params, hf.float_params,
                                           idx.offsets, idx.items, N, code, budget, thr, Q, W, sk, sc,
                                           order, out, counts, codes, prod)
            run(False)
            t_lsh = median_time(lambda: run(False), 5) / nq
            t_lsh_prod = median_time(lambda: run(True), 5) / nq
            recall = np.mean([len(set(top[q]) & set(out[q, :counts[q]])) / 10 for q in range(nq)])
            act = counts.mean()
            say(f"| {fam} | {K} | {L} | {R} | {t_build:.2f} | {t_rehash:.2f} | {mem:.0f} | {sampler} (budget {budget}"
                f"{', m=%d' % thr if sampler == 'threshold' else ''}) | {act:.0f} | {t_lsh * 1e6:.1f} | "
                f"{t_dense1 / t_lsh:.0f}x | {t_denseb / t_lsh:.1f}x | {t_lsh_prod * 1e6:.1f} | {recall:.3f} | "
                f"{act / N:.4f} |")
        say(f"<!-- {fam} K={K}: occupied buckets per table {occupied.size / L:.0f}, mean size "
            f"{occupied.mean():.1f}, full (=128) {np.mean(sizes == 128) * 100:.2f}% of buckets -->")
        del idx
    say()
    say("Columns: build = hash all rows (prange) + counting-sort the L tables; rehash = the same after the "
        "weights moved; index MB = offsets + items + hash parameters; hash+query+sample = one query, one "
        "thread, inside njit (what the engine does per sample); ratios = dense time / LSH time; '+ score "
        "active' adds the inner products of the active set; recall@10 = fraction of the true top-10 in the "
        "active set; random set recall = active / N, the recall of a random set of the same size.")
    say()
    say(f"Total benchmark wall time {time.perf_counter() - t0:.0f} s; load average at the end "
        f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}.")
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
