#!/usr/bin/env bash
# Thread scaling and the dense GPU baseline on a lent many-core GPU machine, in one short run.
#
#     OUT=/some/dir bash bench/device_scaling.sh [THREADS] [N_TRAIN]
#
# 1. bench/threads.py: slide's network and PyTorch's sampled softmax (TF's recipe; that machine
#    has PyTorch, not TensorFlow) at 1..N threads on xc200k, same data and settings each time.
# 2. bench/compare.py with the same settings at the most threads: PyTorch's full softmax and
#    sampled softmax on the GPU (--torch-device cuda) and the full softmax on the CPU, beside
#    slide's run of step 1 (reused from the cache: same data, settings and engine); the CPU's
#    full softmax for 40 batches only (its epoch time extrapolated).
# Everything lands in $OUT/device_scaling.tar.gz (the machine sends back few files) and the
# two tables are printed last.
set -u
THREADS=${1:-1,2,4,8,16}
N_TRAIN=${2:-30000}
MAX_T=${THREADS##*,}
WORK=${WORK:-/tmp/device_scaling}
PY=${PYTHON:-python3}
mkdir -p "$WORK" "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{
  date -u; nproc; lscpu | grep -E "Model name|Socket|Thread|Core|NUMA node\(s\)|L3"
  nvidia-smi -L 2>/dev/null
  "$PY" -c "import numpy, numba, scipy, sklearn, torch; print('numpy', numpy.__version__, \
'numba', numba.__version__, 'scipy', scipy.__version__, 'sklearn', sklearn.__version__, \
'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
  git log -1 --format='commit %H' 2>/dev/null
} 2>&1 | tee "$WORK/machine.txt"
COMMON=(--data xc200k --n-train "$N_TRAIN" --n-test 5000 --cache-dir "$WORK/cache")
timeout 360 "$PY" bench/threads.py --data xc200k --n-train "$N_TRAIN" --n-test 5000 \
  --threads "$THREADS" --systems slide,torch_sampled --out "$WORK/threads_xc200k" \
  -- --cache-dir "$WORK/cache" 2>&1 | tee "$WORK/threads.log" | grep -v "^\s*\[eval\]"
timeout 100 "$PY" bench/compare.py "${COMMON[@]}" --epochs 1 --threads "$MAX_T" \
  --systems slide,torch,torch_sampled --torch-device "${TORCH_DEVICE:-cuda}" \
  --reuse-systems slide \
  --lr 1e-3 --num-sampled 2048 --candidate-sampler unigram --tf-target one \
  --slide-param lr_schedule=constant --slide-param rerank=False --evals-per-epoch 1 \
  --out "$WORK/gpu_xc200k" > "$WORK/gpu.log" 2>&1
timeout 80 "$PY" bench/compare.py "${COMMON[@]}" --epochs 1 --threads "$MAX_T" \
  --systems slide,torch --reuse-systems slide --max-batches 40 \
  --lr 1e-3 --num-sampled 2048 --candidate-sampler unigram --tf-target one \
  --slide-param lr_schedule=constant --slide-param rerank=False --evals-per-epoch 1 \
  --out "$WORK/cpu_dense_xc200k" > "$WORK/cpu_dense.log" 2>&1
(cd "$WORK" && tar czf "$OUT/device_scaling.tar.gz" --exclude=cache/data-* --exclude='*.npz' .)
cat "$WORK/threads_xc200k.md" 2>/dev/null
grep -E "^\| (system|slide|PyTorch)" "$WORK/gpu_xc200k/results.md" 2>/dev/null | cut -c1-400
grep -E "^\| (PyTorch)" "$WORK/cpu_dense_xc200k/results.md" 2>/dev/null | cut -c1-400
tail -n 3 "$WORK/gpu.log" "$WORK/cpu_dense.log"
