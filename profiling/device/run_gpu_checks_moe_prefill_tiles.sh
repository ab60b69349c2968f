#!/usr/bin/env bash
# Issue 4, one H200 call (eleventh session of 2026-12-02): the prefill gate_up tile. v1 TN=128 dequantizes each
# weight tile once per 128 routed rows; TN=256 halves that per FLOP, and the ws tile with two 64-row weight
# tiles per consumer warpgroup (m_tiles=2, the down GEMM's prefill tile) halves the activation re-reads. Both
# lost to v1 TN=128 before, with the fused gate_up quantizing in its epilogue; auto's gate_up now quantizes
# afterwards (quantize_after). Same-run sweep (sweep_moe_gemm_tiles.py --tiles), both presets, T = 4096, 16384.
# Next (thirty-second session, 2026-12-05): again if v1's activation gather with a whole number of pieces per thread
# wins its A/B (run_gpu_checks_moe_gather_pieces.sh; the v1 TN=128 / TN=256 tiles then issue about half the
# instructions per stage; docs/moe_gemm.md, "Next steps"), with gather_pieces=1 added to the v1 tilings below:
# v1 TN=128 may then beat the down GEMM's ws prefill tile, and TN=256 the gate_up's TN=128.
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_moe_prefill_tiles.sh
set -uo pipefail
OUT=${OUT:-runs/moe_prefill_tiles}
BUDGET=${BUDGET:-300}
DIR="$OUT/moe_prefill_tiles"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
qa="quantize_after=1"
TILES="tile_tokens=128,stages=2,chunks_per_stage=2,$qa;tile_tokens=128,stages=4,min_blocks=1,warpgroups=2,variant=ws,m_tiles=2,$qa"
TILES+=";tile_tokens=256,stages=2,chunks_per_stage=2,min_blocks=1,$qa;tile_tokens=256,stages=4,min_blocks=1,$qa"
for shape in qwen3-30b-a3b qwen3-235b-a22b; do
  timeout 120 python3 profiling/sweep_moe_gemm_tiles.py --shape "$shape" --tokens 4096,16384 \
    --kinds gate_up_swiglu,down_routed --tiles "$TILES" --reps 5 --out "$DIR/moe_prefill_tiles_$shape.json" \
    > "$DIR/sweep_$shape.log" 2>&1
  echo "sweep $shape exit $? (${SECONDS}s)"
  grep -E "^T=" "$DIR/sweep_$shape.log" | grep -v best \
    | sed -E 's/TileConfig\(tile_tokens=([0-9]+), stages=([0-9]+), min_blocks=([0-9]+).*variant=.([a-z0-9]+).*chunks_per_stage=([0-9]+).*\)/\4 tn\1 st\2 cps\5/'
done
