"""Probe (round 5): peak memory and seconds of prediction at the full Amazon-670K shape.

    python bench/probes/probe_predict_memory.py [train seconds]

The full ``amazon670k`` preset's 490,449 training rows, ``SlideClassifier()`` trained for a
few seconds (``time_budget``: a completed fit, so the neighbour vote's memory is built), then
2,000 test rows predicted exactly with the vote, exactly by the network alone, and sparsely
(the serving index, built at its first use); then the model is saved and loaded back by
``slide.load`` in a fresh process. Prints the peak resident memory of the process after each
step (and the loading process's own) and the commit of the ``slide`` package it imported (run
it with PYTHONPATH set to a checkout of another commit to measure that one).
"""
import os
import resource
import subprocess
import sys
import tempfile
import time

import slide
from slide import SlideClassifier
from slide.synthetic import generate


def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


root = os.path.dirname(os.path.dirname(os.path.abspath(slide.__file__)))
commit = subprocess.run(["git", "-C", root, "rev-parse", "--short=10", "HEAD"],
                        capture_output=True, text=True).stdout.strip()
budget = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
X, Y, Xt, Yt = generate("amazon670k", seed=0, n_train=490449, n_test=2000)
print(f"slide at {commit}; data: peak {peak_mib():.0f} MiB", flush=True)
m = SlideClassifier(time_budget=budget, random_state=0, n_threads=2).fit(X, Y)
print(f"fit ({m.train_seconds_:.1f} s of training): peak {peak_mib():.0f} MiB", flush=True)
t = time.perf_counter()
m.predict_topk(Xt, 5)
print(f"exact, with the vote: {time.perf_counter() - t:.1f} s, peak {peak_mib():.0f} MiB",
      flush=True)
t = time.perf_counter()
m.predict_topk(Xt, 5, neighbours=0)
print(f"exact, network alone: {time.perf_counter() - t:.1f} s, peak {peak_mib():.0f} MiB",
      flush=True)
t = time.perf_counter()
m.predict_topk(Xt, 5, exact=False)
print(f"sparse (serving index built): {time.perf_counter() - t:.1f} s, peak {peak_mib():.0f} "
      f"MiB", flush=True)
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "m.slide")
    t = time.perf_counter()
    m.save(path)
    size = os.path.getsize(path) / 2**20
    print(f"save: {time.perf_counter() - t:.1f} s, {size:.0f} MiB file", flush=True)
    # the child's own peak: VmHWM (Linux keeps ru_maxrss across exec, so a child started from
    # this process would report this process's peak)
    code = ("import re, time, slide; t = time.perf_counter(); slide.load(%r); "
            "hwm = int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1]); "
            "print(f'load (a fresh process, slide from {slide.__file__}): "
            "{time.perf_counter() - t:.1f} s, peak {hwm / 1024:.0f} MiB')" % path)
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # cwd: a "-c" program puts its working directory first on sys.path, which in a checkout
    # would import that checkout's slide instead of the one measured
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=tmp)
    print(out.stdout.strip() or out.stderr.strip()[-500:], flush=True)
    print(f"(loaded by slide from {root})", flush=True)
