#!/usr/bin/env bash
# H200 session 5: diag_vis.py as is, with the debug probe, and with every thread acquiring.
# Needs packages/mono-glm53/bench/results/h200_session5/experiment_flags.patch applied (git apply).
set -u
export PYTHONPATH=$PWD/packages/mono-common/src:$PWD/packages/mono-glm53/src
export TRITON_CACHE_DIR=$PWD/.triton-cache MONO_GUARD_MODE=report PYTHONUNBUFFERED=1
CASES=${CASES:-tp1:2:1:1000,tp1:8:8:4096}
for v in base DBG ACQ; do
  env $( [ $v != base ] && echo MONO_DIAG_$v=1 ) timeout ${VIS_S:-150} python3 packages/mono-glm53/bench/diag_vis.py ${N:-60} "$CASES" > "$OUT/vis_$v.log" 2>&1
  echo "$v rc=$?"; grep "VIS\|prog\|programs\|Error" "$OUT/vis_$v.log" | cut -c1-300 | head -40
done
