#!/usr/bin/env bash
# H200 session 6: two candidate fixes of the first-launch failures, each on the whole fused
# kernel with shared memory poisoned before every fused launch (diag_smem.py, which crashed at
# its 5th object without a fix): the GEMV tiles' masked rows/columns addressing row/column 0
# (MONO_DIAG_CLAMP=1) and one program per SM (ONE_PER_SM=1). Then the mono-glm53 GPU suite with
# the first candidate that came through clean (or with none).
# Needs results/h200_session6/experiment_flags.patch applied to 58c1fb1 (before the epoch fix).
set -u
export PYTHONPATH=$PWD/packages/mono-common/src:$PWD/packages/mono-glm53/src
export TRITON_CACHE_DIR=$PWD/.triton-cache MONO_GUARD_MODE=report PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"
WIN=""
for v in ${CANDS:-MONO_DIAG_CLAMP ONE_PER_SM}; do
  env POISON=1 $v=1 timeout ${EXP_S:-75} python3 packages/mono-glm53/bench/diag_smem.py ${N:-40} ${CASES:-tp1:2:1:1000} > "$OUT/fix_$v.log" 2>&1
  rc=$?; line=$(grep SMEMRATE "$OUT/fix_$v.log"); echo "$v rc=$rc $line"; grep "SMEM \|Error" "$OUT/fix_$v.log" | cut -c1-250 | head -4
  if [ -z "$WIN" ] && [ $rc = 0 ] && echo "$line" | grep -q "staged 0/0 of"; then WIN=$v; fi
done
echo "suite with: ${WIN:-no candidate}"
timeout ${SUITE_S:-400} env ${WIN:+$WIN=1} python3 -m pytest -q -rA -p no:cacheprovider -p no:hypothesispytest --durations=0 \
    packages/mono-glm53/tests/kernels > "$OUT/kernels.log" 2>&1
echo "rc=$?" >> "$OUT/kernels.log"
grep -n "PASSED\|FAILED\|ERROR\|passed\|failed\|rc=" "$OUT/kernels.log" | cut -c1-250 | head -45
