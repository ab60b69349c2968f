#!/usr/bin/env bash
# Issue 4, one H200 call: wgmmas as wide as each CTA's routed rows (TileConfig.n_step).
#   (1) the MoE GPU tests (the n_step extra tiles bitwise against every other tile, batch-invariant, graphs, PDL)
#   (2) the layer, auto_ns0 (auto without n_step) against auto in one process, ROUNDS rounds (layer_ab_rounds),
#       T = TOKENS
#   (3) memcheck / racecheck on the tiny layer over every tiling
# The recorded run (profiling/results/moe_columns_h200.json) predates the adoption: its arms were the tables then named
# auto (auto_ns0 now), auto_ns (auto now, but with n_step on the direct TN=16 down tile too) and auto_ns128 (auto_ns
# with the TN=128 tile from 12 to 64 routed rows per expert; dropped).
# Usage (repo root; carry .whl and .tkcache, built here by moe_prebuild.py):
#   OUT=$OUT bash profiling/device/run_gpu_checks_moe_columns.sh -> $OUT/moe_columns.tar
set -uo pipefail
OUT=${OUT:-runs/moe_columns}
TOKENS=${TOKENS:-64,128,192,256,384,512,768,1024,1536,2048}
ROUNDS=${ROUNDS:-2}
BUDGET=${BUDGET:-560}
DIR="$OUT/moe_columns"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
moe_build 120 "$DIR/build_tests.log" tiny qwen3-30b-a3b
moe_build 100 "$DIR/build_235b.log" --tables auto,auto_ns0 --no-extras qwen3-235b-a22b
gpu_tests 150 "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
layer_ab_rounds "$DIR" "$ROUNDS" 170 120 --variants auto_ns0,auto --tokens "$TOKENS"
moe_sanitizers_left "$DIR" 60
