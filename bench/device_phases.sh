#!/usr/bin/env bash
# Where a batch's time goes at many threads, with and without the many-core changes, on a lent
# many-core machine, in one short run (bench/probes/probe_block_phases.py, side by side).
#
#     OUT=/some/dir bash bench/device_phases.sh [THREADS] [BATCHES]
#
# For xc200k (30k rows) and, where its files were carried gzipped to .carry/debcontents/, the
# real 133k-label set: at THREADS (default 16) and 8 threads, the probe's --compare (the
# engine before this round's many-core changes and after them, twice each, interleaved, then
# each change alone, in one process on the same batches), on Numba's TBB and OpenMP threading
# layers (COMPARE=0 skips these); then at THREADS on TBB the row steps as one loop and as three
# (--compare-steps; STEPS=0 skips it); last, the engine beside a busy core on each layer. First
# the fork and join of one parallel loop on each threading layer (probe_fork_join.py) and a
# batch's time in and between its kernels (probe_batch_overheads.py). Where
# Numba cannot load TBB, a libtbb.so.12 carried in .carry/tbb/ is preloaded. machine.txt has
# the cores' round trip between a few pairs (bench/crosscore.py). Logs go to $OUT,
# and all of them into $OUT/device_phases.tar.gz.
set -u
T=${1:-16}
BATCHES=${2:-200}
OUT=${OUT:-/tmp/device_phases}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
for f in .carry/debcontents/*.txt.gz; do [ -e "$f" ] && gunzip -kf "$f"; done 2>/dev/null
# shellcheck source=bench/device_tbb.sh
. bench/device_tbb.sh
{
  date -u; nproc; lscpu | grep -E "Model name|L3"; git log -1 --format='commit %H' 2>/dev/null
  git status --short | head -n 20
  echo "threading layer: $TBB_LAYER"
  # how far apart the cores are: 0 and its neighbour, and 0 and the farthest (dies apart?)
  last=$(( $(nproc) - 1 ))
  for pair in 0,1 "0,$(( $(nproc) / 2 ))" "0,$last"; do
    echo "cpus $pair: $("$PY" bench/crosscore.py --cpus "$pair" --repeat 3 | tr '\n' ' ')"
  done
} > "$OUT/machine.txt" 2>&1
for layer in tbb omp workqueue; do
  for work in 200 2000; do
    NUMBA_THREADING_LAYER=$layer timeout 60 "$PY" bench/probes/probe_fork_join.py \
      --threads "$T" --work "$work" --calls 1000 2>&1 | tail -n 1
  done
done > "$OUT/fork_join_t$T.log"
# what a batch costs beyond its work at THREADS: its kernels' time and the time between them
timeout 120 "$PY" bench/probes/probe_batch_overheads.py --threads "$T" --batches 60 \
  > "$OUT/batch_overheads_xc200k_t$T.log" 2>&1
SETS=("xc200k|")
[ -e .carry/debcontents/train.txt ] && SETS+=("debcontents|--data .carry/debcontents/train.txt")
for entry in "${SETS[@]}"; do
  set_name=${entry%%|*}; data=${entry#*|}
  if [ "${STEPS:-1}" != 0 ]; then
    log="$OUT/row_steps_${set_name}_t$T.log"
    # shellcheck disable=SC2086
    timeout 150 "$PY" bench/probes/probe_block_phases.py $data --threads "$T" \
      --batches "$BATCHES" --compare-steps > "$log" 2>&1
    echo "== $set_name, $T threads, row steps"; grep -A 8 "^| configuration" "$log"
  fi
  [ "${COMPARE:-1}" = 0 ] && continue
  for t in $T 8; do
    for lay in tbb omp; do
      log="$OUT/phases_${set_name}_t${t}_$lay.log"
      # shellcheck disable=SC2086
      NUMBA_THREADING_LAYER=$lay timeout 150 "$PY" bench/probes/probe_block_phases.py $data \
        --threads "$t" --batches "$BATCHES" --compare > "$log" 2>&1
      echo "== $set_name, $t threads, $lay"; grep -A 12 "^| configuration" "$log"
    done
  done
done | tee "$OUT/summary.txt"
# beside another user's single-threaded job (one busy core): the engine as now on each layer
"$PY" -c "while True: pass" &
busy=$!
for lay in tbb omp; do
  log="$OUT/phases_busy_xc200k_t${T}_$lay.log"
  NUMBA_THREADING_LAYER=$lay timeout 100 "$PY" bench/probes/probe_block_phases.py \
    --threads "$T" --batches "$BATCHES" > "$log" 2>&1
  echo "== busy core, xc200k, $T threads, $lay: $(grep '^total' "$log")"
done | tee -a "$OUT/summary.txt"
kill "$busy"
# the device tool brings back few files: everything also in one archive
(cd "$OUT" && tar czf device_phases.tar.gz --exclude=device_phases.tar.gz ./*.log ./*.txt)
cat "$OUT/machine.txt" "$OUT/fork_join_t$T.log"
