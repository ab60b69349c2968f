#!/usr/bin/env bash
# Issue 4, one H200 call after auto's v1 ring tiles took n_step (TileConfig.n_step: wgmmas as wide as each CTA's
# routed rows), the checks a default change needs and the layer at the benchmark's T:
#   (1) the MoE GPU tests (every table and extra tile bitwise, batch-invariant, graphs, PDL)
#   (2) the rollout engine's GPU tests (its MoE layers on the new auto)
#   (3) the layer, auto against auto_ns0 (auto before n_step) and auto:down0 (auto with 30B's direct TN=16 down tile
#       stepped at 7 CTAs/SM, DOWN16 below) in one process, two rounds in swapped arm order, T = TOKENS;
#       JSONs $DIR/layer_ab_{1,2}.json
#   (4) memcheck / racecheck on the tiny layer over every tiling
# Usage (repo root; carry .whl and .tkcache, built here by moe_prebuild.py and prebuild_engine_kernels.py):
#   OUT=$OUT bash profiling/device/run_gpu_checks_moe_columns_final.sh -> $OUT/moe_columns_final.tar
set -uo pipefail
OUT=${OUT:-runs/moe_columns_final}
TOKENS=${TOKENS:-1,8,32,64,128,256,512,1024,2048,4096,16384}
BUDGET=${BUDGET:-560}
DIR="$OUT/moe_columns_final"
DOWN16="tile_tokens=16,stages=1,min_blocks=7,warpgroups=1,weights_direct=2,n_step=8"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
moe_build 120 "$DIR/build_tests.log" tiny qwen3-30b-a3b
moe_build 100 "$DIR/build_235b.log" --tables auto,auto_ns0 --no-extras --tiles "$DOWN16" qwen3-235b-a22b
prebuild_engine_test_models 100 "$DIR/build_engine.log"; echo "engine build (${SECONDS}s)"; tail -1 "$DIR/build_engine.log"
gpu_tests 150 "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
gpu_tests 150 "$DIR/engine_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_guidance_capture.py \
  tests/rl/test_engine_kernels.py
layer_ab_swapped "$DIR" 170 150 auto,auto_ns0,auto:down0 --down-tiles "$DOWN16" --tokens "$TOKENS"
moe_sanitizers_left "$DIR" 60
