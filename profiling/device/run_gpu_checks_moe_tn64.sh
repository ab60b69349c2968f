#!/usr/bin/env bash
# Issue 4, one H200 call (eleventh session of 2026-12-02): a TN=64 band between the TN=32 decode tile and
# the TN=128 prefill tile? At 32-64 routed rows per expert (T = 512-1024 at top-8 of 128 experts) TN=128
# computes up to twice the MMA columns it keeps. Same-run sweep (sweep_moe_gemm_tiles.py --tiles,
# quantize_after as auto runs it, fused gate_up and down timed apart), both presets.
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_moe_tn64.sh
set -uo pipefail
OUT=${OUT:-runs/moe_tn64}
BUDGET=${BUDGET:-300}
DIR="$OUT/moe_tn64"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
qa="quantize_after=1"
TILES="tile_tokens=32,stages=2,chunks_per_stage=4,$qa;tile_tokens=64,stages=2,chunks_per_stage=4,$qa"
TILES+=";tile_tokens=64,stages=2,chunks_per_stage=2,$qa;tile_tokens=64,stages=4,$qa"
TILES+=";tile_tokens=128,stages=2,chunks_per_stage=2,$qa;tile_tokens=128,stages=4,min_blocks=1,warpgroups=2,variant=ws,m_tiles=2,$qa"
for shape in qwen3-30b-a3b qwen3-235b-a22b; do
  tokens=512,768,1024,1536,2048; [ "$shape" = qwen3-235b-a22b ] && tokens=512,1024,2048
  timeout 120 python3 profiling/sweep_moe_gemm_tiles.py --shape "$shape" --tokens "$tokens" \
    --kinds gate_up_swiglu,down_routed --tiles "$TILES" --reps 10 --out "$DIR/moe_tn64_$shape.json" \
    > "$DIR/sweep_$shape.log" 2>&1
  echo "sweep $shape exit $? (${SECONDS}s)"
  grep -E "^T=" "$DIR/sweep_$shape.log" | grep -v best \
    | sed -E 's/TileConfig\(tile_tokens=([0-9]+), stages=([0-9]+), min_blocks=([0-9]+).*chunks_per_stage=([0-9]+).*\)/tn\1 st\2 cps\4/'
done
