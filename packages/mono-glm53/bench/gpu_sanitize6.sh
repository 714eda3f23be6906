#!/usr/bin/env bash
# H200 session 6: compute-sanitizer synccheck and racecheck on the fused launch stopped after
# stage 1, then on the whole fused launch.
# Needs results/h200_session6/experiment_flags.patch applied to 58c1fb1 (before the epoch fix).
set -u
export PYTHONPATH=$PWD/packages/mono-common/src:$PWD/packages/mono-glm53/src
export TRITON_CACHE_DIR=$PWD/.triton-cache MONO_GUARD_MODE=report PYTHONUNBUFFERED=1
CASE=${CASE:-tp1:2:1:1000}
which compute-sanitizer || ls /usr/local/cuda/bin | head
# compile outside the sanitizer first
MONO_DIAG_LAST=1 python3 packages/mono-glm53/bench/diag_sanitize.py 1 $CASE > "$OUT/san_warm.log" 2>&1; echo warm rc=$?
python3 packages/mono-glm53/bench/diag_sanitize.py 1 $CASE >> "$OUT/san_warm.log" 2>&1; echo warm2 rc=$?
san() { name=$1; tool=$2; shift 2; env "$@" timeout ${SAN_S:-100} compute-sanitizer --tool $tool ${SANOPT:-} --print-limit 20 python3 packages/mono-glm53/bench/diag_sanitize.py ${N:-2} $CASE > "$OUT/san_$name.log" 2>&1
  echo "$name rc=$?"; grep -v "^=========     \|^$" "$OUT/san_$name.log" | cut -c1-220 | head -${SHOW:-14}; }
for v in ${RUNS:-sync1 race1 syncall raceall}; do
  case $v in
    sync1) san sync1 synccheck MONO_DIAG_LAST=1 ;;
    race1) san race1 racecheck MONO_DIAG_LAST=1 ;;
    syncall) san syncall synccheck X=1 ;;
    raceall) san raceall racecheck X=1 ;;
    memall) san memall memcheck X=1 ;;
  esac
done
