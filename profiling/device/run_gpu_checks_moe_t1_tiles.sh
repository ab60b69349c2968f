#!/usr/bin/env bash
# Issue 4, one H200 call (eleventh session of 2026-12-02): the tile below 1/4 routed row per expert (T = 1-4 at
# top-8 of 128 experts), where the layer runs at 17% (30B) / 40% (235B) of its roofline and the fused epilogue
# costs +10-21%. Candidates: auto's ws tile (two consumer warpgroups, 2 CTAs/SM), the same with quantize_after,
# with its epilogue on the producer's spare warps (async_epilogue), one consumer warpgroup at 3 CTAs/SM, and v1's
# one-warpgroup tile (auto's from 1/8 to 1 row). Same-run sweep (sweep_moe_gemm_tiles.py --tiles), both presets.
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_moe_t1_tiles.sh
set -uo pipefail
OUT=${OUT:-runs/moe_t1_tiles}
BUDGET=${BUDGET:-300}
DIR="$OUT/moe_t1_tiles"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
ws="tile_tokens=8,stages=5,variant=ws,chunks_per_stage=2"
TILES="$ws,min_blocks=2,warpgroups=2;$ws,min_blocks=2,warpgroups=2,quantize_after=1"
TILES+=";$ws,min_blocks=2,warpgroups=2,async_epilogue=1;$ws,min_blocks=3,warpgroups=1"
TILES+=";tile_tokens=8,stages=4,min_blocks=4,warpgroups=1,quantize_after=1"
for shape in qwen3-30b-a3b qwen3-235b-a22b; do
  timeout 120 python3 profiling/sweep_moe_gemm_tiles.py --shape "$shape" --tokens 1,2,4 \
    --kinds gate_up_swiglu,down_routed --tiles "$TILES" --reps 20 --out "$DIR/moe_t1_tiles_$shape.json" \
    > "$DIR/sweep_$shape.log" 2>&1
  echo "sweep $shape exit $? (${SECONDS}s)"
  grep -E "^T=" "$DIR/sweep_$shape.log" | grep -v best \
    | sed -E 's/TileConfig\(tile_tokens=([0-9]+), stages=([0-9]+), min_blocks=([0-9]+), warpgroups=([0-9]+).*variant=.([a-z0-9]+).*async_epilogue=([A-Za-z]+).*quantize_after=([A-Za-z]+)\)/\5 mb\3 wg\4 ae=\6 qa=\7/'
done
