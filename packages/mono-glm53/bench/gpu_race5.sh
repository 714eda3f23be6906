#!/usr/bin/env bash
# H200 session 5: fused-vs-staged race rates without and with the per-thread fence (diag_race.py).
# Needs packages/mono-glm53/bench/results/h200_session5/experiment_flags.patch applied (git apply).
set -u
export PYTHONPATH=$PWD/packages/mono-common/src:$PWD/packages/mono-glm53/src
export TRITON_CACHE_DIR=$PWD/.triton-cache MONO_GUARD_MODE=report PYTHONUNBUFFERED=1
CASES=${CASES:-tp8:2:2:4096,tp8:8:8:4096,tp1:4:3:65536,tp1:8:8:4096}
for f in 0 1; do
  MONO_DIAG_FENCE=$f timeout ${RACE_S:-200} python3 packages/mono-glm53/bench/diag_race.py ${N:-40} "$CASES" > "$OUT/race_fence$f.log" 2>&1
  echo "fence $f rc=$?"; grep "RACE\|DETAIL\|Error" "$OUT/race_fence$f.log" | cut -c1-400
done
