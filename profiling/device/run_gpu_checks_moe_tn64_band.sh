#!/usr/bin/env bash
# Issue 4, one H200 call: a TN=64 ring with n_step from 32 to 64 routed rows per expert (A/B table auto_w64).
#   (1) the MoE GPU tests (the TN=64 n_step extra tile bitwise against every other tile, batch-invariant)
#   (2) the layer, auto against auto_w64 in one process, two rounds in swapped arm order, T = TOKENS;
#       JSONs $DIR/layer_ab_{1,2}.json
#   (3) memcheck / racecheck on the tiny layer over every tiling
# Usage (repo root; carry .whl and .tkcache, built here by moe_prebuild.py):
#   OUT=$OUT bash profiling/device/run_gpu_checks_moe_tn64_band.sh -> $OUT/moe_tn64_band.tar
set -uo pipefail
OUT=${OUT:-runs/moe_tn64_band}
TOKENS=${TOKENS:-384,512,640,768,896,1024,1536}
BUDGET=${BUDGET:-400}
DIR="$OUT/moe_tn64_band"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
moe_build 120 "$DIR/build_tests.log" tiny qwen3-30b-a3b
moe_build 100 "$DIR/build_235b.log" --tables auto,auto_w64 --no-extras qwen3-235b-a22b
gpu_tests 120 "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
layer_ab_swapped "$DIR" 120 120 auto,auto_w64 --tokens "$TOKENS"
moe_sanitizers_left "$DIR" 50
