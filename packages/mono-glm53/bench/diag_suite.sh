# H200 session-4 hunt: pytest on the kernels suite with bench/diag_plugin.py checking every launch.
export PYTHONPATH=$PWD/packages/mono-common/src:$PWD/packages/mono-glm53/src:$PWD/packages/mono-glm53/bench
export TRITON_CACHE_DIR=$PWD/.triton-cache MONO_GUARD_MODE=report PYTHONUNBUFFERED=1
for i in ${REPS:-1 2}; do
timeout 150 python3 -m pytest -q -s -p no:cacheprovider -p no:hypothesispytest -p diag_plugin packages/mono-glm53/tests/kernels \
  -k "${K:-tp8-2 or tp1-2 or graph or table}" > $OUT/suite$i.log 2>&1; echo "iter $i rc=$?"
grep -n "DIAG\|passed\|failed" $OUT/suite$i.log | head -20
done
