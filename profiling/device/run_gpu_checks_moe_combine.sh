#!/usr/bin/env bash
# Issue 4, one H200 call (fourteenth session, 2026-12-03): the down GEMM's ordered top-k combine in its epilogue
# (TileConfig.fused_combine, v1; the table auto_cb sets it on auto's v1 down tiles).
#   (1) the MoE GPU tests (the combining extra tiles bitwise against the combine kernel, counters left zero,
#       graphs and programmatic dependent launches with v1_cb, the routing check)
#   (2) layer A/B in one process, ROUNDS rounds: bench_moe_gemm.py --variants auto,auto_cb; JSONs $DIR/layer_ab_R.json
#   (3) the rollout engine's GPU tests with TRACE_KERNELS_MOE_VARIANT=auto_cb (every default down call combining)
#   (4) memcheck / racecheck on the tiny layer over every tiling
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_moe_combine.sh
set -uo pipefail
OUT=${OUT:-runs/moe_combine}
BUDGET=${BUDGET:-400}
ROUNDS=${ROUNDS:-3}
DIR="$OUT/moe_combine"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
moe_build 120 "$DIR/build_tests.log" tiny qwen3-30b-a3b
moe_build 90 "$DIR/build_tables.log" --no-extras --tables auto,auto_cb qwen3-30b-a3b qwen3-235b-a22b
gpu_tests 150 "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
layer_ab_rounds "$DIR" "$ROUNDS" 60 150 --variants auto,auto_cb --tokens 1,8,32,64,128,256,512
TRACE_KERNELS_MOE_VARIANT=auto_cb prebuild_engine_test_models 60 "$DIR/build_engine.log"; echo "engine build (${SECONDS}s)"
TRACE_KERNELS_MOE_VARIANT=auto_cb gpu_tests $(( $(left) - 70 )) "$DIR/engine_tests.log" tests/rl/test_engine_gpu.py \
  tests/rl/test_guidance_capture.py tests/rl/test_engine_kernels.py
moe_sanitizers_left "$DIR" 40
