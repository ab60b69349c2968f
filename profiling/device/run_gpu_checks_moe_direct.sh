#!/usr/bin/env bash
# Issue 4, one H200 call (thirteenth session, 2026-12-03): v1 with its weights straight into registers
# (TileConfig.weights_direct: each thread's code and scale bytes loaded WDIRECT K chunks ahead, the token tile's
# activations resident in shared memory for the whole K; no ring, no CTA barrier or proxy fence in the main loop).
#   (1) the MoE GPU tests (the new extra tiles bitwise against every other tile, batch invariance, graphs)
#   (2) sweep_moe_gemm_tiles.py --tiles: the decode table tiles against direct tiles, down GEMM and fused gate_up
#       (quantize_after, as auto runs it) timed apart, both presets
#   (3) Nsight Compute on the 30B down GEMM at T=64: the table's tile, then the direct one-warpgroup tile
#   (4) memcheck / racecheck on the tiny layer over every tiling
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_moe_direct.sh
set -uo pipefail
OUT=${OUT:-runs/moe_direct}
BUDGET=${BUDGET:-560}
DIR="$OUT/moe_direct"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
timeout 150 python3 profiling/moe_prebuild.py --jobs 16 tiny qwen3-30b-a3b > "$DIR/build_tests.log" 2>&1
echo "test build exit $? (${SECONDS}s)"; tail -2 "$DIR/build_tests.log"
gpu_tests 170 "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
source profiling/device/moe_direct_tiles.sh
sweep_bands "$DIR" direct qwen3-30b-a3b "${BANDS_30B[@]}"
sweep_bands "$DIR" direct qwen3-235b-a22b "${BANDS_235B[@]}"
# Nsight Compute on the 30B down GEMM at T=64: the table's one-warpgroup tile (EXTRA_TILES[0]), then the direct one
for case in "ring 8,4,4,1" "direct 8,1,4,1,weights_direct=4"; do
  read -r label fields <<< "$case"
  [ "$(left)" -lt 200 ] && break
  ncu_down_tile "$DIR" "$label" 64 "$fields"
done
limit=$(( ($(left) - 5) / 2 )); [ "$limit" -gt 60 ] && limit=60
[ "$limit" -gt 15 ] && moe_sanitizers "$DIR" "$limit"
