#!/usr/bin/env bash
# Issue 4, one call (written 2026-12-05, thirty-third session): v1's activation gather with a whole number of pieces per
# thread (TileConfig.gather_pieces). Ran on 2026-12-05 (thirty-fourth session, an H100, at 41bd1a3 when the knob was off
# in auto and the "auto_gp" table turned it on; docs/moe_gemm.md, "Next steps" item 3); auto has it since, and the arms
# are now auto_gp0 (without) and auto (with).
#   (1) the MoE GPU tests: every table and extra tile bitwise, the gather_pieces extras among them (4, 8 and 2 pieces per
#       thread, a resident direct tile), batch invariance across all of them
#   (2) the layer, auto_gp0 against auto in one process, two rounds in swapped arm order, T = TOKENS (T=64 runs the same
#       kernels in both arms: the control); JSONs $DIR/layer_ab_{1,2}.json
#   (3) memcheck / racecheck on the tiny layer over every tiling
# The kernels come prebuilt in .tkcache_moe (the moe_build steps then only check it; without it they build on the device,
# ~2 min of the budget): python profiling/prebuild_device_caches.py --cache .tkcache_moe moe_tests
# Usage (repo root; carry .whl and .tkcache_moe, not .tkcache: the three fill most of the 64 MiB):
#   OUT=$OUT bash profiling/device/run_gpu_checks_moe_gather_pieces.sh -> $OUT/moe_gather_pieces.tar
set -uo pipefail
OUT=${OUT:-runs/moe_gather_pieces}
TOKENS=${TOKENS:-64,1024,4096,16384}
BUDGET=${BUDGET:-560}
DIR="$OUT/moe_gather_pieces"
mkdir -p "$DIR"
export TRACE_KERNELS_CACHE_DIR=${TRACE_KERNELS_CACHE_DIR:-$PWD/.tkcache_moe}
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
moe_build 160 "$DIR/build_tests.log" tiny qwen3-30b-a3b
moe_build 100 "$DIR/build_235b.log" --tables auto,auto_gp0 --no-extras qwen3-235b-a22b
gpu_tests 170 "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
layer_ab_swapped "$DIR" 130 110 auto_gp0,auto --tokens "$TOKENS"
moe_sanitizers_left "$DIR" 60
