#!/usr/bin/env bash
# A record: it names memory-kernel variants removed on 2026-12-05 (refit_weights v1, v3-v7, v10, v11; quantize v1,
# v4; guided_fake_quantize v1-v6 as variants), so it runs as written only on commit 32f5e89 or earlier.
# refit v8 (v7's speculation with the guess checked per warp, no atomics, no zeroed workspace, phase 1 a programmatic
# dependent launch) on the H200 in one call: the refit GPU tests of every variant and refit_weights_packed_'s,
# compute-sanitizer memcheck and racecheck on v8's tests, ROUNDS (default 2) rounds of bench_memory_kernels.py on refit
# v2, v7 and v8 (phase 1 with and without PDL) on fresh, steady and mixed weights (a quarter of the experts' amax moved
# per call), then, with the time left, the RL layer's GPU tests.
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_refit_v8.sh -> $OUT/refit_v8.tar
set -uo pipefail
OUT=${OUT:-runs/refit_v8}
BUDGET=${BUDGET:-560}
DIR="$OUT/refit_v8"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
timeout 100 python3 profiling/prebuild_memory_kernels.py --jobs 16 nvfp4_refit > "$DIR/build_memory.log" 2>&1
echo "memory build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_memory.log"
gpu_tests 150 "$DIR/refit_gpu_tests.log" -m gpu tests/gpu/test_quantize_kernels.py -k "refit"
gpu_tests 40 "$DIR/refit_packed_gpu_tests.log" -m gpu tests/gpu/test_refit_packed.py
V8_TESTS=(tests/gpu/test_quantize_kernels.py -k "refit and v8 and not large")
sanitize memcheck 50 "$DIR/memcheck_refit_v8.log" python3 -m pytest -q -p no:cacheprovider -m gpu "${V8_TESTS[@]}"
sanitize racecheck 60 "$DIR/racecheck_refit_v8.log" python3 -m pytest -q -p no:cacheprovider -m gpu "${V8_TESTS[@]}"
for round in $(seq 1 "${ROUNDS:-2}"); do
  [ "$(left)" -gt 60 ] || break
  timeout $(( $(left) - 5 )) python3 profiling/bench_memory_kernels.py \
    --select refit_weights:v2,refit_weights:v7,refit_weights:v8 --refit-v8-pdl 1,0 \
    --sizes-mb 16,64,256,1024 --copy-study-mb "" --no-host-overhead --out "$DIR/memory_refit_v8_$round.json" \
    > "$DIR/bench_$round.log" 2>&1
  echo "bench $round exit $?"; grep -E "^copy|^refit" "$DIR/bench_$round.log"
done
if [ "$(left)" -gt 150 ]; then
  prebuild_engine_test_models 60 "$DIR/build_engine.log"; echo "engine build exit $? (${SECONDS}s)"
  gpu_tests $(( $(left) - 5 )) "$DIR/rl_gpu_tests.log" -m gpu tests/rl
fi
