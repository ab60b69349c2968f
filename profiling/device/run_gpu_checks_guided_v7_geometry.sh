#!/usr/bin/env bash
# Ninth session of 2026-12-02, second call on the H200 (every step under `timeout`, BUDGET s):
#   1. guided v7 at other occupancies (bench_memory_kernels.py --guided-v7-geometry): full guidance with
#      counters on v7's tables at 4 and 5 CTAs of 128 threads per SM (ptxas spills 4 / 8 bytes there, which
#      is why codegen keeps that call on v4's kernel), compact with counters at 4 x 128; 64 / 256 MB
#   2. meanwhile the rollout engine's kernels of both test models are built (16 nvcc jobs; run 1 is the control
#      under the same load); then the engine's GPU tests with the new defaults (decode mma4l, guided v7) and
#      the trainer's quantizer tests
# Usage (repo root; carry .whl): OUT=$OUT bash profiling/device/run_gpu_checks_guided_v7_geometry.sh -> $OUT/guided_v7_geometry.tar
set -uo pipefail
OUT=${OUT:-runs/guided_v7_geometry}
BUDGET=${BUDGET:-540}
DIR="$OUT/guided_v7_geometry"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/setup.log"

prebuild_engine_test_models 200 "$DIR/build_engine.log" &
build=$!

run=0
for geometry in "" "full_counters=128x4" "full_counters=128x5,compact_counters=128x4"; do
  run=$((run + 1))
  timeout 70 python3 profiling/bench_memory_kernels.py --select guided_fake_quantize:v7 --sizes-mb 64,256 \
    --copy-study-mb "" --no-host-overhead --guided-v7-geometry "$geometry" --out "$DIR/guided_v7_geometry$run.json" \
    > "$DIR/bench$run.log" 2>&1
  echo "bench $run [$geometry] exit $? (${SECONDS}s)"
  grep -E "^guided|^copy" "$DIR/bench$run.log" | grep -v "no-counters" | sed "s/guided_fake_quantize //" | tr -s " " | cut -c1-60
done

wait $build; echo "engine prebuild exit $? (${SECONDS}s)"; tail -1 "$DIR/build_engine.log"
gpu_tests $(( $(left) - 20 )) "$DIR/engine_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_guidance_capture.py \
  tests/rl/test_engine_kernels.py tests/rl/test_trainer_quantizers.py
