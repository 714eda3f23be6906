#!/usr/bin/env bash
# One H200 call within its time limit (CALL_S seconds): the whole mono-glm53 GPU suite, the
# layer benchmark of this tree (`python3 -m mono_glm53.bench`, TP8 shard and TP1, unfused vs
# mono), then, if BASE names a `git archive` of another commit's src folders carried to the
# machine, that tree's mono path in the same run for side-by-side numbers, and the fused
# launch's stamped per-stage spans (diag_stages.py) of both trees with the time left.
# WARM=1: first every variant of the suite compiled in parallel (warm_cache.py), and the base
# tree's WARM_BASE variants beside it; ORDER=diag-first: the diags before the benches.
# BENCH_SHAPES / BASE_SHAPES: the bench shapes (default tp8,tp1); BASE_DIAG=0 skips the base
# tree's diag; DIAG_ARGS: more diag_stages.py arguments (such as --nprog 132,264).
# Usage (repo root): OUT=dir [BASE=dir] [WARM=1] [ORDER=diag-first] bash packages/mono-glm53/bench/gpu_call.sh
set -u
export TRITON_CACHE_DIR=$PWD/.triton-cache MONO_GUARD_MODE=report PYTHONUNBUFFERED=1
CALL_S=${CALL_S:-575}
left() { echo $(( CALL_S - SECONDS - ${1:-0} )); }
srcs() { echo "$1/packages/mono-common/src:$1/packages/mono-glm53/src"; }
bench() { local tree=$1 tag=$2 paths=$3 shapes=$4 lim=$(left 10)
  [ "$lim" -gt 40 ] || { echo "bench $tag skipped (time)"; return; }
  PYTHONPATH=$(srcs "$tree") timeout "$lim" python3 -m mono_glm53.bench --shapes "$shapes" \
    --paths "$paths" --out "$OUT/bench_$tag" --max-seconds $(( lim - 30 )) > "$OUT/bench_$tag.log" 2>&1
  echo "bench rc=$? t=${SECONDS}s" >> "$OUT/bench_$tag.log"; grep -v "^{\|^scaled_mm\|Warn\|warn" "$OUT/bench_$tag.log" | tail -40 | cut -c1-90; }
diag() { local tree=$1 tag=$2 lim=$(left 5)
  [ "$lim" -gt 30 ] || { echo "diag $tag skipped (time)"; return; }
  PYTHONPATH=$(srcs "$tree") timeout "$lim" python3 packages/mono-glm53/bench/diag_stages.py --no-staged ${DIAG_ARGS:-} \
    --out "$OUT" --cases ${CASES:-tp8:2:4096,tp8:2:65536} > "$OUT/diag_$tag.log" 2>&1
  echo "rc=$? t=${SECONDS}s" >> "$OUT/diag_$tag.log"; mv "$OUT/diag_stages.json" "$OUT/diag_$tag.json" 2>/dev/null
  python3 -c "
import json
for r in json.load(open('$OUT/diag_$tag.json')):
    print('$tag', r['width'], r['ctx'], 'np', r.get('nprog'), 'fused', round(r['fused_us'],1), {k: round(v['span'],1) for k, v in r['fused_stamps_us'].items()})" 2>&1 | cut -c1-500; }
if [ -n "${WARM:-}" ]; then
  [ -n "${BASE:-}" ] && PYTHONPATH=$(srcs "$BASE") timeout ${WARM_S:-200} python3 packages/mono-glm53/bench/warm_cache.py \
    --variants ${WARM_BASE:-tp8:2,tp8:8} > "$OUT/warm_base.log" 2>&1 &
  PYTHONPATH=$(srcs "$PWD") timeout ${WARM_S:-200} python3 packages/mono-glm53/bench/warm_cache.py > "$OUT/warm.log" 2>&1
  echo "warm rc=$? t=${SECONDS}s" >> "$OUT/warm.log"; wait; tail -12 "$OUT/warm.log" | cut -c1-160
  [ -n "${BASE:-}" ] && { echo "warm_base done t=${SECONDS}s" >> "$OUT/warm_base.log"; tail -4 "$OUT/warm_base.log" | cut -c1-160; }; fi
PYTHONPATH=$(srcs "$PWD") timeout $(left ${BENCH_RESERVE:-200}) python3 -m pytest -q -rA --timeout ${TEST_S:-150} --tb=short \
  -p no:cacheprovider -p no:hypothesispytest --durations=0 packages/mono-glm53/tests/kernels > "$OUT/glm53_suite.log" 2>&1
echo "rc=$? t=${SECONDS}s" >> "$OUT/glm53_suite.log"
grep -n "FAILED\|ERROR\|passed\|failed\|rc=" "$OUT/glm53_suite.log" | cut -c1-250 | head -30
benches() { bench "$PWD" new unfused,mono ${BENCH_SHAPES:-tp8,tp1}
  [ -z "${BASE:-}" ] || bench "$BASE" base unfused,mono ${BASE_SHAPES:-${BENCH_SHAPES:-tp8,tp1}}; }  # call 2 ran "mono tp8": the bench needs unfused first
diags() { diag "$PWD" new; [ -z "${BASE:-}" ] || [ "${BASE_DIAG:-1}" = 0 ] || diag "$BASE" base; }
if [ "${ORDER:-}" = diag-first ]; then diags; benches; else benches; diags; fi
