#!/usr/bin/env bash
# H200 session 4: the GPU test suite of mono-glm53 on the pointer-table kernel, logs under $OUT.
# Usage (repo root): OUT=dir bash packages/mono-glm53/bench/gpu_session4.sh [pytest -k expr]
set -u
export PYTHONPATH=$PWD/packages/mono-common/src:$PWD/packages/mono-glm53/src
export TRITON_CACHE_DIR=$PWD/.triton-cache MONO_GUARD_MODE=report PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"
K=${1:-}
timeout 420 python3 -m pytest -q -rA -p no:cacheprovider packages/mono-glm53/tests/kernels \
    ${K:+-k "$K"} --junitxml="$OUT/kernels.xml" > "$OUT/kernels.log" 2>&1
echo "rc=$?" >> "$OUT/kernels.log"
tail -40 "$OUT/kernels.log"
if [ -z "$K" ]; then
  timeout 200 python3 -m pytest -q -rA -p no:cacheprovider packages/mono-common/tests/kernels \
      --junitxml="$OUT/common_kernels.xml" > "$OUT/common_kernels.log" 2>&1
  echo "rc=$?" >> "$OUT/common_kernels.log"
  tail -5 "$OUT/common_kernels.log"
fi
