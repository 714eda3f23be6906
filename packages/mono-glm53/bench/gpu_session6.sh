#!/usr/bin/env bash
# H200 session 6, after the epoch fix (mono-common 0.1.3 epoch_begin): the mono-glm53 GPU suite,
# then the mono-common GPU suite (pytest-timeout ends a hung test, so pytest still prints why
# each test failed; the session-6 run, without it, was cut before that).
# Usage (repo root): OUT=dir bash packages/mono-glm53/bench/gpu_session6.sh
set -u
export PYTHONPATH=$PWD/packages/mono-common/src:$PWD/packages/mono-glm53/src
export TRITON_CACHE_DIR=$PWD/.triton-cache MONO_GUARD_MODE=report PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"
py() { timeout "$1" python3 -m pytest -q -rA --timeout ${TEST_S:-150} --tb=short -p no:cacheprovider -p no:hypothesispytest --durations=0 "${@:2}"; }
py ${SUITE_S:-480} packages/mono-glm53/tests/kernels > "$OUT/glm53_kernels.log" 2>&1; echo "rc=$?" >> "$OUT/glm53_kernels.log"
grep -n "FAILED\|ERROR\|passed\|failed\|rc=" "$OUT/glm53_kernels.log" | cut -c1-250 | head -30
py ${COMMON_S:-100} packages/mono-common/tests/kernels > "$OUT/common_kernels.log" 2>&1; echo "rc=$?" >> "$OUT/common_kernels.log"
grep -n "FAILED\|ERROR\|passed\|failed\|rc=" "$OUT/common_kernels.log" | cut -c1-250 | head -20
