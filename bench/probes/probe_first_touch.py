"""What a fresh process's first write to memory costs on this machine, against memory another
process freed moments before (``bench.common.prefault``; docs/design.md, "This machine's
memory"). Each round: idle ``--idle`` seconds, then one fresh process writes ``--gib`` GiB
twice ("idle": its first write, then its second), then right after it another fresh process
does the same ("reused"). Prints one line per process.

    python bench/probes/probe_first_touch.py [--gib 1] [--rounds 3] [--idle 25]
"""
import argparse
import subprocess
import sys
import time

CHILD = r"""
import sys, time
import numpy as np
a = np.empty(int(float(sys.argv[1]) * (1 << 30)) // 4, np.float32)
t0 = time.perf_counter(); a[:] = 1.0
t1 = time.perf_counter(); a[:] = 2.0
t2 = time.perf_counter()
print(f"{t1 - t0:.3f} {t2 - t1:.3f}")
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--idle", type=float, default=25.0, help="seconds before each round")
    args = ap.parse_args()
    print(f"# {args.gib:g} GiB written twice by a fresh process; rounds of: {args.idle:g} s "
          f"idle, then one process ('idle'), then another right after it ('reused')")
    for r in range(args.rounds):
        time.sleep(args.idle)
        for kind in ("idle", "reused"):
            out = subprocess.run([sys.executable, "-c", CHILD, str(args.gib)],
                                 capture_output=True, text=True, check=True).stdout.split()
            print(f"round {r} {kind:6s} first write {out[0]} s, second write {out[1]} s",
                  flush=True)


if __name__ == "__main__":
    main()
