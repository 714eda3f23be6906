#!/usr/bin/env bash
# H200 session 4: the layer kernel before (old_head/: HEAD's sources, argument ABI) and after
# (this tree: pointer table) this change, timed in one run (diag_stages: fused time and
# per-stage times). Make old_head/ first: mkdir old_head && git archive main packages/mono-common/src \
#   packages/mono-glm53/src packages/mono-glm53/bench/diag_stages.py | tar -x -C old_head (carry it).
# Then the closing `mono bench glm53` table (unfused vs monokernel).
set -u
export TRITON_CACHE_DIR=$PWD/.triton-cache MONO_GUARD_MODE=report PYTHONUNBUFFERED=1
CASES=${CASES:-tp8:2:4096,tp8:8:4096}
for tree in old_head new; do
  root=$PWD; [ "$tree" = old_head ] && root=$PWD/old_head
  mkdir -p "$OUT/$tree"
  PYTHONPATH=$root/packages/mono-common/src:$root/packages/mono-glm53/src timeout 200 \
    python3 "$root/packages/mono-glm53/bench/diag_stages.py" --out "$OUT/$tree" --cases "$CASES" \
    > "$OUT/$tree/diag.log" 2>&1
  echo "$tree rc=$?"; tail -3 "$OUT/$tree/diag.log" | cut -c1-400
done
if [ "${BENCH:-1}" = 1 ]; then
  PYTHONPATH=$PWD/packages/mono-common/src:$PWD/packages/mono-glm53/src timeout 240 \
    python3 -m mono_glm53.bench --shapes tp8 --paths unfused,mono --out "$OUT/bench" --max-seconds 200 \
    > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"; tail -30 "$OUT/bench.log"
fi
