#!/usr/bin/env bash
# H200 session 6: first-launch failure rate and what the wrong qkva entries hold (diag_vis.py):
# as is; qkva filled with 7.0 (stores that never land show 7.0); hn filled with 3.0 (stage 1
# reading hn from before stage 0 wrote it fails the second launch too); num_stages 1; a device
# sync before each launch; CUDA_LAUNCH_BLOCKING=1.
# Needs results/h200_session6/experiment_flags.patch applied to 58c1fb1 (before the epoch fix).
set -u
export PYTHONPATH=$PWD/packages/mono-common/src:$PWD/packages/mono-glm53/src
export TRITON_CACHE_DIR=$PWD/.triton-cache MONO_GUARD_MODE=report PYTHONUNBUFFERED=1
CASES=${CASES:-tp1:2:1:1000}
run() { name=$1; shift; env "$@" timeout ${VIS_S:-85} python3 packages/mono-glm53/bench/diag_vis.py ${N:-50} "$CASES" > "$OUT/order_$name.log" 2>&1
  echo "$name rc=$?"; grep "VIS\|Error" "$OUT/order_$name.log" | cut -c1-260 | head -${SHOW:-8}; }
for v in ${RUNS:-base fillq fillh stages1 sync blocking}; do
  case $v in
    base) run base X=1 ;;
    fillq) run fillq MONO_VIS_FILL=qkva=7.0 ;;
    fillh) run fillh MONO_VIS_FILL=hn=3.0 ;;
    stages1) run stages1 MONO_DIAG_STAGES=1 ;;
    sync) run sync MONO_DIAG_SYNC=1 ;;
    blocking) run blocking CUDA_LAUNCH_BLOCKING=1 ;;
  esac
done
