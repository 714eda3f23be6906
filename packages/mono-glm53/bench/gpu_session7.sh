#!/usr/bin/env bash
# H200 session 7: the tests session 6 did not see pass (the capture test with CaptureRows, TP 2/4/8
# side by side, both fault tests), then the rest of the mono-glm53 GPU suite, then the bench
# (TP8 shard, unfused vs mono) in what is left of the call; the Triton cache goes back as a
# tarball so a later call can carry it (.triton-cache) and skip the ~27 s compiles.
# Usage (repo root): OUT=dir [CALL_S=570] bash packages/mono-glm53/bench/gpu_session7.sh
set -u
export PYTHONPATH=$PWD/packages/mono-common/src:$PWD/packages/mono-glm53/src
export TRITON_CACHE_DIR=$PWD/.triton-cache MONO_GUARD_MODE=report PYTHONUNBUFFERED=1
CALL_S=${CALL_S:-570}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"
left() { echo $(( CALL_S - SECONDS - ${1:-0} )); }
py() { local lim=$1 log=$2; shift 2
  timeout "$lim" python3 -m pytest -q -rA --timeout ${TEST_S:-150} --tb=short -p no:cacheprovider \
    -p no:hypothesispytest --durations=0 "$@" > "$log" 2>&1; echo "rc=$? t=${SECONDS}s" >> "$log"
  grep -n "FAILED\|ERROR\|passed\|failed\|rc=" "$log" | cut -c1-250 | head -30; }
K=packages/mono-glm53/tests/kernels
FIRST="capture or tp_ranks or fault"
if [ -n "${ONLY_FIRST:-}" ] || [ -z "${SKIP_FIRST:-}" ]; then
  py $(left ${FIRST_RESERVE:-250}) "$OUT/glm53_first.log" $K -k "$FIRST"; fi
if [ -z "${ONLY_FIRST:-}" ]; then
  py $(left ${REST_RESERVE:-60}) "$OUT/glm53_rest.log" $K -k "not ($FIRST)"; fi
B=$(left 40)
if [ "$B" -gt 60 ]; then
  timeout "$B" python3 packages/mono-glm53/bench/bench_glm53_mono.py --shapes ${BENCH_SHAPES:-tp8} \
    --paths unfused,mono --out "$OUT" --max-seconds $(( B - 40 )) > "$OUT/bench.log" 2>&1
  echo "bench rc=$? t=${SECONDS}s" >> "$OUT/bench.log"; tail -40 "$OUT/bench.log"; fi
tar -C "$PWD" -cJf "$OUT/tcache.txz" .triton-cache 2>/dev/null; ls -la "$OUT"
