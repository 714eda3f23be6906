# H200 session-4 hunt: the fused/staged/delayed launches of the failing cases (bench/diag_session4.py).
export TRITON_CACHE_DIR=$PWD/.triton-cache MONO_GUARD_MODE=report PYTHONUNBUFFERED=1
N=$PWD/packages/mono-common/src:$PWD/packages/mono-glm53/src
C=${C:-tp1:2:1:4096,tp8:2:2:65536}
PYTHONPATH=$N timeout 300 python3 packages/mono-glm53/bench/diag_session4.py --cases $C --modes fused,fused+delay,staged --reps 2 > $OUT/modes.log 2>&1; echo modes $?; grep -v "^  \|^    " $OUT/modes.log | cut -c1-300 | tail -16
