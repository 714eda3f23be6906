#!/usr/bin/env bash
# H200 session 7, second call: the table-built-in-capture test (fixed harness), then the
# fused launch's per-stage clock stamps next to the staged per-stage times, at num_warps 4 and 8.
# Usage (repo root): OUT=dir bash packages/mono-glm53/bench/gpu_diag7.sh
set -u
export PYTHONPATH=$PWD/packages/mono-common/src:$PWD/packages/mono-glm53/src
export TRITON_CACHE_DIR=$PWD/.triton-cache MONO_GUARD_MODE=report PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -q -rA --timeout 140 --tb=short -p no:cacheprovider -p no:hypothesispytest \
  packages/mono-glm53/tests/kernels -k "capture" > "$OUT/capture.log" 2>&1; echo "rc=$? t=${SECONDS}s" >> "$OUT/capture.log"
tail -5 "$OUT/capture.log"
timeout $(( ${CALL_S:-560} - SECONDS )) python3 packages/mono-glm53/bench/diag_stages.py --out "$OUT" \
  --cases ${CASES:-tp8:2:4096,tp8:8:4096} --warps ${WARPS:-4,8} > "$OUT/diag.log" 2>&1
echo "diag rc=$? t=${SECONDS}s" >> "$OUT/diag.log"; tail -c 3000 "$OUT/diag.log"
