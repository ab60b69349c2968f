#!/usr/bin/env bash
# Issue 4: the down GEMM's decode tile. The 30B down-tile sweep (moe_down_decode_sweep_h200.json) put the
# one-warpgroup TN=8 tile 6-7% ahead of the table's two-warpgroup TN=8 tile at T=32 and 64. Same-run A/B of
# the layer, both presets, two rounds; then the quantize kernels' GPU tests (quantize.cuh now opens with the
# PDL wait) and the MoE tests of the tables. The run behind moe_gemm_h200_down1wg.json timed auto (then the
# two-warpgroup tile everywhere) against an uncommitted table "auto_down1wg" (the one-warpgroup tile for
# every down GEMM up to 6 rows per expert); auto now takes it where K <= 1024, and "auto_down2wg" is the
# old auto, so the script now times auto_down2wg against auto.
# Usage (repo root; carry .whl and .tkcache_moe): TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_moe OUT=$OUT \
#   bash profiling/device/run_gpu_checks_moe_down1wg.sh      -> $OUT/moe_down1wg.tar
set -uo pipefail
OUT=${OUT:-runs/moe_down1wg}
BUDGET=${BUDGET:-420}
DIR="$OUT/moe_down1wg"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
timeout 170 python3 profiling/moe_prebuild.py --jobs 16 qwen3-30b-a3b qwen3-235b-a22b > "$DIR/build.log" 2>&1
echo "build exit $? (${SECONDS}s)"; tail -1 "$DIR/build.log"
for round in 1 2; do
  timeout 70 python3 profiling/bench_moe_gemm.py --variants auto_down2wg,auto --tokens 8,32,64,128 --reps 10 \
    --out "$DIR/moe_gemm_h200_down1wg_round$round.json" > "$DIR/bench_round$round.log" 2>&1
  echo "bench round $round exit $? (${SECONDS}s)"; grep -E "^qwen3|^shape" "$DIR/bench_round$round.log" | tail -9
done
limit=$(( $(left) - 40 )); [ "$limit" -gt 90 ] && limit=90
[ "$limit" -gt 20 ] && gpu_tests "$limit" "$DIR/quantize_gpu_tests.log" tests/gpu/test_quantize_kernels.py -k "test_quantize"
limit=$(( $(left) - 3 ))
[ "$limit" -gt 15 ] && gpu_tests "$limit" "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py -k "not programmatic"
