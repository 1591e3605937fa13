# Sourced by the device scripts (bench/device_phases.sh, bench/device_scaling.sh): a lent
# machine runs slide from the copied tree, without its dependencies, and Numba quietly falls
# back to OpenMP where the tbb package is missing (so did the 16-core runs before
# device_phases_3e37504/). Where a libtbb.so.12 was carried to .carry/tbb/ (from this machine's
# .venv/lib), it is preloaded. Sets TBB_LAYER to what the parallel loops run on; needs $PY.
layer_now() {   # the threading layer slide's parallel loops get here
  "$PY" bench/probes/probe_fork_join.py --threads 2 --calls 1 --work 1 2>&1 | tail -n 1 \
    | awk '{print $2}'
}
TBB_LAYER=$(layer_now)
if [ "$TBB_LAYER" != tbb ] && [ -e .carry/tbb/libtbb.so.12 ]; then
  export LD_PRELOAD=$PWD/.carry/tbb/libtbb.so.12
  TBB_LAYER="$TBB_LAYER, then with the carried libtbb: $(layer_now)"
fi
