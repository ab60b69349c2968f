#!/usr/bin/env bash
# refit v9 (v8's speculation, the verdicts in a launch of their own, one wave sharing out the failed experts' tiles) and
# refit_weights_packed_'s speculative variant v2 on the H200 in one call: the refit GPU tests of every variant and the
# packed op's of both variants, compute-sanitizer memcheck and racecheck on v9's and packed v2's small tests,
# ROUNDS (default 2) rounds of bench_memory_kernels.py on refit v2, v8 and v9 (fresh, steady and mixed weights),
# bench_moe_pack.py --what refit (v1 against v2 on fresh, steady and mixed weights, both presets), then the RL layer's
# GPU tests (the engine's weight sync is the packed op, v2 by default), time allowing.
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_refit_v9_packed.sh
#   -> $OUT/refit_v9.tar   (PREBUILD=0 skips building the other memory kernels; what the steps need is in .tkcache;
#   REFIT=0 skips refit_weights' tests and sanitizers, ROUNDS=0 its benchmark: the packed op's steps alone)
set -uo pipefail
OUT=${OUT:-runs/refit_v9}
BUDGET=${BUDGET:-570}
DIR="$OUT/refit_v9"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
if [ "${PREBUILD:-1}" = 1 ]; then
  timeout 100 python3 profiling/prebuild_memory_kernels.py --jobs 16 nvfp4_refit > "$DIR/build_memory.log" 2>&1
  echo "memory build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_memory.log"
fi
[ "${REFIT:-1}" = 1 ] && gpu_tests 150 "$DIR/refit_gpu_tests.log" -m gpu tests/gpu/test_quantize_kernels.py -k "refit"
gpu_tests 150 "$DIR/refit_packed_gpu_tests.log" -m gpu tests/gpu/test_refit_packed.py --durations=5
V9_TESTS=(tests/gpu/test_quantize_kernels.py -k "refit and v9 and not large")
PACKED_TESTS=(tests/gpu/test_refit_packed.py -k "v2 and not 1536 and not 2048")
for tool in memcheck racecheck; do
  [ "${REFIT:-1}" = 1 ] && sanitize "$tool" 60 "$DIR/${tool}_refit_v9.log" python3 -m pytest -q -p no:cacheprovider \
    -m gpu "${V9_TESTS[@]}"
  sanitize "$tool" 90 "$DIR/${tool}_refit_packed_v2.log" python3 -m pytest -q -p no:cacheprovider -m gpu \
    "${PACKED_TESTS[@]}"
done
for round in $(seq 1 "${ROUNDS:-2}"); do
  [ "$(left)" -gt 150 ] || break
  timeout 90 python3 profiling/bench_memory_kernels.py --select refit_weights:v2,refit_weights:v8,refit_weights:v9 \
    --sizes-mb 16,64,256,1024 --copy-study-mb "" --no-host-overhead --out "$DIR/memory_refit_v9_$round.json" \
    > "$DIR/bench_$round.log" 2>&1
  echo "bench $round exit $?"; grep -E "^copy|^refit" "$DIR/bench_$round.log" | grep -v "\[v2\]"
done
[ "$(left)" -gt 90 ] && { timeout 80 python3 profiling/bench_moe_pack.py --what refit --reps 20 \
  --out "$DIR/refit_packed_v2_h200.json" > "$DIR/bench_packed.log" 2>&1; echo "bench_packed exit $?";
  grep -E "qwen3|v2 fresh" "$DIR/bench_packed.log"; }
if [ "$(left)" -gt 120 ]; then
  prebuild_engine_test_models 60 "$DIR/build_engine.log"; echo "engine build exit $? (${SECONDS}s)"
  gpu_tests $(( $(left) - 5 )) "$DIR/rl_gpu_tests.log" -m gpu tests/rl  # the packed op's default: v2
fi
