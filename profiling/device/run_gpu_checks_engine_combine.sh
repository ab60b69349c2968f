#!/usr/bin/env bash
# Tenth session of 2026-12-02 on the H200, last call (every step under `timeout`, BUDGET s): the rollout engine's
# and the trainer's GPU tests on this tree (decode's split combine launched as a programmatic dependent, in and out
# of CUDA graphs; guided v7's kernels in every audit mode), and compute-sanitizer memcheck / racecheck on v7's
# capped-grid guided tests at the committed geometry (full guidance with counters at 2 x 256 threads per SM).
# Usage (repo root; carry .whl): OUT=$OUT bash profiling/device/run_gpu_checks_engine_combine.sh -> $OUT/engine_combine.tar
set -uo pipefail
OUT=${OUT:-runs/engine_combine}
BUDGET=${BUDGET:-560}
DIR="$OUT/engine_combine"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/setup.log"

prebuild_engine_test_models 240 "$DIR/build_engine.log" &
timeout 240 python3 profiling/prebuild_memory_kernels.py --jobs 6 nvfp4_guided_fake_quantize_bf16_v7 \
  > "$DIR/build_memory.log" 2>&1
echo "memory build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_memory.log"
wait; echo "engine prebuild (${SECONDS}s)"; tail -1 "$DIR/build_engine.log"

limit=$(( ($(left) - 10) / 4 )); [ "$limit" -gt 60 ] && limit=60
sanitize memcheck "$limit" "$DIR/sanitizer_memcheck.log" python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_quantize_kernels.py -k "(persistent and guided and v7) or (nonfinite and guided and v7)"
sanitize racecheck "$limit" "$DIR/sanitizer_racecheck.log" python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_quantize_kernels.py -k "persistent and guided and v7"
gpu_tests $(( $(left) - 5 )) "$DIR/engine_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_guidance_capture.py \
  tests/rl/test_engine_kernels.py tests/rl/test_trainer_quantizers.py
