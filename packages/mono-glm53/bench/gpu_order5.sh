#!/usr/bin/env bash
# H200 session 5: first-launch failure rate (diag_vis.py): as is, with a device sync before each
# launch, with CUDA_LAUNCH_BLOCKING=1, and at num_stages 1.
# Needs packages/mono-glm53/bench/results/h200_session5/experiment_flags.patch applied (git apply).
set -u
export PYTHONPATH=$PWD/packages/mono-common/src:$PWD/packages/mono-glm53/src
export TRITON_CACHE_DIR=$PWD/.triton-cache MONO_GUARD_MODE=report PYTHONUNBUFFERED=1
CASES=${CASES:-tp1:2:1:1000,tp1:8:8:4096}
run() { name=$1; shift; env "$@" timeout ${VIS_S:-90} python3 packages/mono-glm53/bench/diag_vis.py ${N:-60} "$CASES" > "$OUT/order_$name.log" 2>&1
  echo "$name rc=$?"; grep "VIS\|Error" "$OUT/order_$name.log" | cut -c1-200 | head -8; }
run base X=1
run sync MONO_DIAG_SYNC=1
run blocking CUDA_LAUNCH_BLOCKING=1
run stages1 MONO_DIAG_STAGES=1
