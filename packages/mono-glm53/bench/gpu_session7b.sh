#!/usr/bin/env bash
# H200 session 7, third and fourth calls: the stamped per-stage profile of the base tree (BASE,
# e.g. a `git archive` of the previous commit's src folders) and of this tree side by side
# (DIAG_FIRST=1, the default; DIAG_FIRST=0 profiles this tree last, if time is left), with
# WARM=1 first every variant compiled in parallel (warm_cache.py), then this tree's whole
# mono-glm53 GPU suite, then the bench (TP8 shard and TP1, unfused vs mono).
# Usage (repo root): OUT=dir [BASE=dir] [WARM=1] [DIAG_FIRST=0] bash packages/mono-glm53/bench/gpu_session7b.sh
set -u
export TRITON_CACHE_DIR=$PWD/.triton-cache MONO_GUARD_MODE=report PYTHONUNBUFFERED=1
CALL_S=${CALL_S:-570}
left() { echo $(( CALL_S - SECONDS - ${1:-0} )); }
diag() { local tree=$1 tag=$2
  PYTHONPATH=$tree/packages/mono-common/src:$tree/packages/mono-glm53/src timeout $(( CALL_S - SECONDS > 150 ? 150 : CALL_S - SECONDS )) python3 \
    packages/mono-glm53/bench/diag_stages.py --out "$OUT" --cases ${CASES:-tp8:2:4096,tp8:8:4096} > "$OUT/diag_$tag.log" 2>&1
  echo "rc=$? t=${SECONDS}s" >> "$OUT/diag_$tag.log"; mv "$OUT/diag_stages.json" "$OUT/diag_$tag.json" 2>/dev/null
  python3 -c "
import json,sys
for r in json.load(open('$OUT/diag_$tag.json')):
    print('$tag', r['width'], r['ctx'], 'fused', round(r['fused_us'],1), {k: round(v['span'],1) for k, v in r['fused_stamps_us'].items()})" 2>&1 | cut -c1-400; }
if [ "${DIAG_FIRST:-1}" = 1 ]; then [ -n "${BASE:-}" ] && diag "$BASE" base; diag "$PWD" new; fi
export PYTHONPATH=$PWD/packages/mono-common/src:$PWD/packages/mono-glm53/src
if [ -n "${WARM:-}" ]; then
  timeout ${WARM_S:-120} python3 packages/mono-glm53/bench/warm_cache.py > "$OUT/warm.log" 2>&1
  echo "warm rc=$? t=${SECONDS}s" >> "$OUT/warm.log"; cat "$OUT/warm.log" | cut -c1-200 | tail -14; fi
py() { local lim=$1 log=$2; shift 2
  timeout "$lim" python3 -m pytest -q -rA --timeout ${TEST_S:-150} --tb=short -p no:cacheprovider \
    -p no:hypothesispytest --durations=0 "$@" > "$log" 2>&1; echo "rc=$? t=${SECONDS}s" >> "$log"
  grep -n "FAILED\|ERROR\|passed\|failed\|rc=" "$log" | cut -c1-250 | head -30; }
py $(left ${BENCH_RESERVE:-130}) "$OUT/glm53_suite.log" packages/mono-glm53/tests/kernels
B=$(left 20)
if [ "$B" -gt 40 ]; then
  timeout "$B" python3 packages/mono-glm53/bench/bench_glm53_mono.py --shapes ${BENCH_SHAPES:-tp8,tp1} \
    --paths unfused,mono --out "$OUT" --max-seconds $(( B - 30 )) > "$OUT/bench.log" 2>&1
  echo "bench rc=$? t=${SECONDS}s" >> "$OUT/bench.log"; grep -v "^{\|^scaled_mm" "$OUT/bench.log" | tail -70 | cut -c1-90; fi
if [ "${DIAG_FIRST:-1}" = 0 ] && [ "$(left)" -gt 40 ]; then diag "$PWD" new; fi
