#!/usr/bin/env bash
# The mono-glm53 GPU suite (and mono-common's) within one device call: every layer variant
# compiled in parallel first (warm_cache.py, the knob sets of test_layer_knobs_gpu.py too), then
# the tests as groups of pytest processes at once, sharing the one GPU under MPS. Run one after
# another, the suite takes far longer than a call's 10 minutes (most of it compiling and the
# 65536-token references); at once, each group's time is its own.
# ONLY: a comma list of group names to run (default all, see `group` below); CALL_S: the
# call's limit in seconds (groups still running then are cut: a cut group has not failed, and
# its log says how far it got). Each group writes $OUT/g_<name>.log; the last lines printed
# are every group's PASSED / FAILED lines and its exit status (124: cut by the time).
# Memory (H200, ~139 GB): the three-world all-reduce holds ~40 GB, each TP1 case ~20 GB; on an
# H100 (~78 GB) the TP1 groups are left out unless ONLY names them, and all the other groups at
# once ran it out of memory (session 25: allred, procs and fault beside the rest): there, name
# fewer groups a call (ONLY=allred,... then ONLY=procs,fault,...).
# The warm step compiles only the variants of the chosen groups' shapes (`warm_cache.py --shapes`),
# the knob sets for a knobs group and the reference-checked knob builds for a hold group
# (`--builds`: hold0 and hold1 split `test_layer_gpu.HOLD_CASES`; hold is both).
# Usage (repo root): OUT=dir [ONLY=knobs,fault] [CALL_S=585] bash packages/mono-glm53/bench/gpu_suite.sh
set -u
export TRITON_CACHE_DIR=$PWD/.triton-cache MONO_GUARD_MODE=report PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/packages/mono-common/src:$PWD/packages/mono-glm53/src
T=packages/mono-glm53/tests/kernels
MEM=$(python3 -c "import torch; print(torch.cuda.get_device_properties(0).total_memory >> 30)")
ALL=knobs0,knobs1,knobs2,fault,ref8a,ref8b,ref8i,hold0,hold1,mixed,wraps,layer,allred,procs,common
[ "$MEM" -gt 100 ] && ALL=$ALL,ref1a,ref1b
SEL=${ONLY:-$ALL}
# the warm step compiles only what the chosen groups launch: the TP8 variants (and the knob
# sets) for the TP8 groups, TP1's for ref1a/ref1b, the ranks side by side for allred/procs
# (all of them took 244 s of a 366 s call for three TP1 groups, session 33)
# the hold groups' HOLD_CASES names (test_layer_gpu.HOLD_GROUPS), read only when one is chosen
HOLD0=""; HOLD1=""
case ",$SEL," in *,hold*)
  HG=$(python3 -c "
import sys
sys.path.insert(0, '$T')
from test_layer_gpu import HOLD_GROUPS
print('|'.join(' '.join(g) for g in HOLD_GROUPS))")
  HOLD0=${HG%%|*}; HOLD1=${HG#*|} ;;
esac
holdk() {  # HOLD_CASES names -> a -k expression selecting exactly their cases
  local e="" n; for n in "$@"; do e="$e or ${n}__"; done; echo "${e# or }"
}
WSH=""; WKN=(); HOLDN=""
for g in ${SEL//,/ }; do
  case $g in
    knobs*) WSH=$WSH,tp8,tp8i; KN=1 ;;
    hold) WSH=$WSH,tp8,tp8i; HOLDN="$HOLDN $HOLD0 $HOLD1" ;;
    hold0) WSH=$WSH,tp8,tp8i; HOLDN="$HOLDN $HOLD0" ;;
    hold1) WSH=$WSH,tp8,tp8i; HOLDN="$HOLDN $HOLD1" ;;
    fault|ref8*|mixed|wraps|layer) WSH=$WSH,tp8,tp8i ;;
    ref1*) WSH=$WSH,tp1 ;;
    allred|procs) WSH=$WSH,sim ;;
  esac
done
# the knob sets once, however many knobs groups are named (reading them imports torch)
[ -n "${KN:-}" ] && WKN=(--knobs "$(python3 -c "
import json, sys
sys.path.insert(0, '$T')
from test_layer_knobs_gpu import KNOB_SETS
print(json.dumps(KNOB_SETS))")")
# the hold groups' knob builds, fused and (width 2) staged, so that no test compiles its own in turn
[ -n "$HOLDN" ] && WKN+=(--builds "$(python3 -c "
import json, sys
sys.path.insert(0, '$T')
from test_layer_gpu import HOLD_CASES
print(json.dumps([[sh, w, kn] for n in dict.fromkeys(sys.argv[1:]) for sh, w, ctx, kn in HOLD_CASES[n]]))" $HOLDN)")
if [ -n "$WSH" ]; then
  timeout ${WARM_S:-240} python3 packages/mono-glm53/bench/warm_cache.py --jobs 15 --shapes "${WSH#,}" ${WKN[@]+"${WKN[@]}"} \
    > "$OUT/warm.log" 2>&1
  echo "warm rc=$? t=${SECONDS}s"
fi
L=$(( ${CALL_S:-585} - SECONDS - 15 ))
REF="test_fused_matches_reference and not mixed"
group() {  # name -> its pytest arguments
  case $1 in
    knobs) echo "$T/test_layer_knobs_gpu.py" ;;
    knobs0|knobs1|knobs2) echo "$T/test_layer_knobs_gpu.py" ;;  # a third of the sets each
    fault) echo "$T/test_layer_gpu.py -k fault" ;;
    ref8a) echo "$T/test_layer_gpu.py -k '$REF and tp8 and (1000 or 4096)'" ;;
    ref8b) echo "$T/test_layer_gpu.py -k '$REF and tp8 and 65536'" ;;
    ref8i) echo "$T/test_layer_gpu.py -k checkpoint_indexer" ;;
    hold) echo "$T/test_layer_gpu.py -k '$(holdk $HOLD0 $HOLD1)'" ;;
    hold0) echo "$T/test_layer_gpu.py -k '$(holdk $HOLD0)'" ;;
    hold1) echo "$T/test_layer_gpu.py -k '$(holdk $HOLD1)'" ;;
    ref1a) echo "$T/test_layer_gpu.py -k '$REF and tp1 and (1000 or 4096)'" ;;
    ref1b) echo "$T/test_layer_gpu.py -k '$REF and tp1 and 65536'" ;;
    mixed) echo "$T/test_layer_gpu.py -k mixed" ;;
    wraps) echo "$T/test_layer_gpu.py -k 'wraps or down_scale or producer or co_residency'" ;;
    layer) echo "$T/test_layer_gpu.py -k 'no_indexer or inside_their or graph'" ;;
    allred) echo "$T/test_layer_gpu.py -k all_reduce_in_kernel" ;;
    procs) echo "$T/test_tp_processes_gpu.py $T/test_demo_gpu.py" ;;
    common) echo "packages/mono-common/tests/kernels" ;;
    *) return 1 ;;
  esac
}
for g in ${SEL//,/ }; do
  args=$(group "${g}") || { echo "no group $g"; continue; }
  part=0/1; case $g in knobs[0-9]) part=${g#knobs}/3 ;; esac
  ( export MONO_KNOB_PART=$part; eval timeout $L python3 -m pytest -q -rA --timeout 400 --tb=short -p no:cacheprovider -p no:hypothesispytest \
      $args > "$OUT/g_$g.log" 2>&1; echo "rc=$? t=${SECONDS}s" >> "$OUT/g_$g.log" ) &
done
wait
for f in "$OUT"/g_*.log; do
  echo "== $(basename "$f")"
  grep -E "^(PASSED|FAILED|ERROR)|^[0-9]+ (passed|failed)|rc=" "$f" | sed 's/^PASSED .*::/PASSED /' | cut -c1-160 | tail -40
done
