#!/usr/bin/env bash
# Thread scaling and the dense GPU baseline on a lent many-core GPU machine, in one short run.
#
#     OUT=/some/dir bash bench/device_scaling.sh [THREADS] [N_TRAIN] [DATA] [EPOCHS]
#
# DATA is a preset (default xc200k) or a directory with train.txt and test.txt (a real set, its
# files carried there: .gz files beside them are unpacked first); N_TRAIN "all" keeps every
# training row; DENSE=0 skips step 2.
#
# 1. bench/threads.py: slide's network and PyTorch's sampled softmax (TF's recipe; that machine
#    has PyTorch, not TensorFlow) at 1..N threads on xc200k, same data and settings each time.
# 2. bench/compare.py with the same settings at the most threads: PyTorch's full softmax and
#    sampled softmax on the GPU (--torch-device cuda) and the full softmax on the CPU, beside
#    slide's run of step 1 (reused from the cache: same data, settings and engine); the CPU's
#    full softmax for 40 batches only (its epoch time extrapolated).
# Numba's threads are TBB where bench/device_tbb.sh finds or preloads it (machine.txt says).
# Everything lands in $OUT/device_scaling.tar.gz (the machine sends back few files) and the
# two tables are printed last.
set -u
THREADS=${1:-1,2,4,8,16}
N_TRAIN=${2:-30000}
DATA=${3:-xc200k}
EPOCHS=${4:-1}
NAME=$(basename "$DATA")
for f in "$DATA"/*.txt.gz; do [ -e "$f" ] && gunzip -kf "$f"; done 2>/dev/null
ROWS=(); [ "$N_TRAIN" != all ] && ROWS=(--n-train "$N_TRAIN")
MAX_T=${THREADS##*,}
WORK=${WORK:-/tmp/device_scaling}
PY=${PYTHON:-python3}
mkdir -p "$WORK" "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
# shellcheck source=bench/device_tbb.sh
. bench/device_tbb.sh
{
  date -u; nproc; lscpu | grep -E "Model name|Socket|Thread|Core|NUMA node\(s\)|L3"
  nvidia-smi -L 2>/dev/null
  "$PY" -c "import numpy, numba, scipy, sklearn, torch; print('numpy', numpy.__version__, \
'numba', numba.__version__, 'scipy', scipy.__version__, 'sklearn', sklearn.__version__, \
'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
  git log -1 --format='commit %H' 2>/dev/null
  echo "threading layer: $TBB_LAYER"
} 2>&1 | tee "$WORK/machine.txt"
COMMON=(--data "$DATA" "${ROWS[@]}" --n-test 5000 --cache-dir "$WORK/cache")
T_ROWS=(--n-train 0); [ "$N_TRAIN" != all ] && T_ROWS=(--n-train "$N_TRAIN")
timeout "${THREADS_LIMIT:-360}" "$PY" bench/threads.py --data "$DATA" "${T_ROWS[@]}" \
  --n-test 5000 --epochs "$EPOCHS" --threads "$THREADS" --systems slide,torch_sampled \
  --out "$WORK/threads_$NAME" -- --cache-dir "$WORK/cache" 2>&1 | tee "$WORK/threads.log" \
  | grep -v "^\s*\[eval\]"
if [ "${DENSE:-1}" = 1 ]; then
timeout 100 "$PY" bench/compare.py "${COMMON[@]}" --epochs 1 --threads "$MAX_T" \
  --systems slide,torch,torch_sampled --torch-device "${TORCH_DEVICE:-cuda}" \
  --reuse-systems slide \
  --lr 1e-3 --num-sampled 2048 --candidate-sampler unigram --tf-target one \
  --slide-param lr_schedule=constant --slide-param rerank=False --evals-per-epoch 1 \
  --out "$WORK/gpu_$NAME" > "$WORK/gpu.log" 2>&1
timeout 80 "$PY" bench/compare.py "${COMMON[@]}" --epochs 1 --threads "$MAX_T" \
  --systems slide,torch --reuse-systems slide --max-batches 40 \
  --lr 1e-3 --num-sampled 2048 --candidate-sampler unigram --tf-target one \
  --slide-param lr_schedule=constant --slide-param rerank=False --evals-per-epoch 1 \
  --out "$WORK/cpu_dense_$NAME" > "$WORK/cpu_dense.log" 2>&1
fi
(cd "$WORK" && tar czf "$OUT/device_scaling.tar.gz" --exclude=cache/data-* --exclude='*.npz' .)
cat "$WORK/threads_$NAME.md" 2>/dev/null
grep -E "^\| (system|slide|PyTorch)" "$WORK/gpu_$NAME/results.md" 2>/dev/null | cut -c1-400
grep -E "^\| (PyTorch)" "$WORK/cpu_dense_$NAME/results.md" 2>/dev/null | cut -c1-400
[ "${DENSE:-1}" = 1 ] && tail -n 3 "$WORK/gpu.log" "$WORK/cpu_dense.log"
