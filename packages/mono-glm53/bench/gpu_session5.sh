#!/usr/bin/env bash
# H200 session 5: fenced launches at real shapes (bench/diag_fenced.py), then the mono-glm53
# GPU suite. Usage (repo root): OUT=dir bash packages/mono-glm53/bench/gpu_session5.sh [pytest -k expr]
set -u
export PYTHONPATH=$PWD/packages/mono-common/src:$PWD/packages/mono-glm53/src
export TRITON_CACHE_DIR=$PWD/.triton-cache MONO_GUARD_MODE=report PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"
if [ "${FENCED:-1}" = 1 ]; then
  timeout ${FENCED_S:-200} python3 packages/mono-glm53/bench/diag_fenced.py ${CASES:-} > "$OUT/fenced.log" 2>&1
  echo "fenced rc=$?" >> "$OUT/fenced.log"; grep "FENCED\|rc=\|Error" "$OUT/fenced.log" | cut -c1-600
fi
K=${1:-}
timeout ${SUITE_S:-380} python3 -m pytest -q -rA -p no:cacheprovider -p no:hypothesispytest --durations=0 \
    packages/mono-glm53/tests/kernels ${K:+-k "$K"} > "$OUT/kernels.log" 2>&1
echo "rc=$?" >> "$OUT/kernels.log"
grep -n "PASSED\|FAILED\|ERROR\|passed\|failed\|rc=" "$OUT/kernels.log" | cut -c1-300 | head -40
