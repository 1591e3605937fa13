"""Probe (round 10): rows per BLAS product in ``label_linear.hard_negatives``, alone.

    python bench/probes/probe_hard_negative_blocks.py [ROWS ...]

The top-10 logits of 34,000 random hidden rows (128 wide) over 25,880 labels (debdeps' shape;
random weights: only the time matters) with ``_MIN_BLOCK_ROWS`` set to each ROWS (default
162 = the old block of 4M entries / 25,880 labels, 512 = today's floor, 2048), each after one
untimed call; BLAS and Numba on every thread. Prints the seconds of each.
"""
import sys
import time

import numpy as np

from slide.kernels.output import OutputLayer
from slide.rank import linear as label_linear

rows_list = [int(r) for r in sys.argv[1:]] or [162, 512, 2048, 162]
rng = np.random.default_rng(0)
H = rng.standard_normal((34_000, 128)).astype(np.float32)
Wo = (rng.standard_normal((25_880, 128)) * 0.1).astype(np.float32)
bo = rng.standard_normal(25_880).astype(np.float32)


all_rows = np.arange(H.shape[0], dtype=np.int64)
label_linear.hard_negatives(OutputLayer(Wo, bo, False), H, all_rows[:600], 10)       # compile, warm BLAS
for r in rows_list:
    label_linear._MIN_BLOCK_ROWS = r
    t0 = time.perf_counter()
    label_linear.hard_negatives(OutputLayer(Wo, bo, False), H, all_rows, 10)
    print(f"rows per product >= {r}: {time.perf_counter() - t0:.2f} s", flush=True)
