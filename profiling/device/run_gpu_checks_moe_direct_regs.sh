#!/usr/bin/env bash
# Issue 4, one H200 call (fourteenth session, 2026-12-03): the down GEMM's direct tiles with their registers
# capped by min_blocks (more CTAs per SM), and the 30B TN=16 direct tile, against the tables' tiles.
#   (1) the MoE GPU tests (the new extra tiles bitwise against every other tile, batch invariance, graphs)
#   (2) sweep_moe_gemm_tiles.py --tiles, down GEMM + combine, bands of profiling/device/moe_direct_regs_tiles.sh
#   (3) layer A/B in one run, ROUNDS rounds: auto against auto:downJ (bench_moe_gemm.py --down-tiles: the
#       direct candidates in auto's TN=8 and TN=16 down bands); JSONs $DIR/layer_ab_R.json
#   (4) memcheck / racecheck on the tiny layer over every tiling
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_moe_direct_regs.sh
set -uo pipefail
OUT=${OUT:-runs/moe_direct_regs}
BUDGET=${BUDGET:-560}
ROUNDS=${ROUNDS:-3}
DIR="$OUT/moe_direct_regs"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
source profiling/device/moe_direct_regs_tiles.sh
moe_build 150 "$DIR/build_tests.log" tiny qwen3-30b-a3b
gpu_tests 150 "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
sweep_bands "$DIR" direct_regs qwen3-30b-a3b "${BANDS_30B[@]}"
sweep_bands "$DIR" direct_regs qwen3-235b-a22b "${BANDS_235B[@]}"
n8=$(tr ';' '\n' <<< "$DIRECT8" | wc -l); n16=$(tr ';' '\n' <<< "$DIRECT16" | wc -l)
arms=auto; for j in $(seq 0 $((n8 + n16 - 1))); do arms="$arms,auto:down$j"; done
layer_ab_rounds "$DIR" "$ROUNDS" 100 120 --variants "$arms" --down-tiles "$DIRECT8;$DIRECT16" --tokens 8,32,64,128,192
moe_sanitizers_left "$DIR" 60
