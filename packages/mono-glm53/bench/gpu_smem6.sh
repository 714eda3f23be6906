#!/usr/bin/env bash
# H200 session 6: diag_smem.py as is, with shared memory poisoned before each fused launch, and
# both again with the fused launch stopped after stage 1 (MONO_DIAG_LAST=1), each also with one
# program per SM forced (ONE_PER_SM=1, *_1sm) or the GEMV tiles' masked rows/columns
# addressing row/column 0 (MONO_DIAG_CLAMP=1, *_clamp); then the Triton
# cache's PTX/TTGIR of the layer kernel into $OUT.
# Needs results/h200_session6/experiment_flags.patch applied to 58c1fb1 (before the epoch fix).
set -u
export PYTHONPATH=$PWD/packages/mono-common/src:$PWD/packages/mono-glm53/src
export TRITON_CACHE_DIR=$PWD/.triton-cache MONO_GUARD_MODE=report PYTHONUNBUFFERED=1
CASES=${CASES:-tp1:2:1:1000}
run() { name=$1; shift; env "$@" timeout ${VIS_S:-80} python3 packages/mono-glm53/bench/diag_smem.py ${N:-50} "$CASES" > "$OUT/smem_$name.log" 2>&1
  echo "$name rc=$?"; grep "SMEM\|Error" "$OUT/smem_$name.log" | cut -c1-300 | head -${SHOW:-6}; grep LAUNCH "$OUT/smem_$name.log" | tail -1; }
for v in ${RUNS:-base poison last1 poisonlast1}; do
  case $v in
    base) run base X=1 ;;
    poison) run poison POISON=1 ;;
    last1) run last1 MONO_DIAG_LAST=1 ;;
    poisonlast1) run poisonlast1 POISON=1 MONO_DIAG_LAST=1 ;;
    poisonlast1_1sm) run poisonlast1_1sm POISON=1 MONO_DIAG_LAST=1 ONE_PER_SM=1 ;;
    base_1sm) run base_1sm ONE_PER_SM=1 ;;
    poison_1sm) run poison_1sm POISON=1 ONE_PER_SM=1 ;;
    poisonlast1_clamp) run poisonlast1_clamp POISON=1 MONO_DIAG_LAST=1 MONO_DIAG_CLAMP=1 ;;
    poison_clamp) run poison_clamp POISON=1 MONO_DIAG_CLAMP=1 ;;
  esac
done
[ -n "${DUMP:-}" ] && find .triton-cache -name 'layer_kernel*' \( -name '*.ptx' -o -name '*.ttgir' -o -name '*.json' \) | tar czf "$OUT/layer_kernel_asm.tgz" -T -
ls -la "$OUT"
