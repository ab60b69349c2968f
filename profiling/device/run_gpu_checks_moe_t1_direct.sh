#!/usr/bin/env bash
# The weights_direct decode tile as the fused gate_up below 1/8 routed row per expert (forty-sixth session): at
# gpt-oss's shapes, T=1, it was the fastest fused gate_up of the fallback sweep (run_gpu_checks_moe_fallback.sh, an
# H100: 0.0256-0.0262 ms quantized afterwards against 0.0272-0.0277 for the ring with row_amax). Here at the Qwen3
# presets, where auto runs the one-warpgroup ws tile with row_amax (WS_RA) and the down GEMM the two-warpgroup ws tile
# (WS2), in one call (BUDGET s): sweep_moe_gemm_tiles.py at T=1 and 2 on Qwen3-30B-A3B and Qwen3-235B-A22B, fused
# gate_up / down GEMM + combine, --check-bitwise, two rounds with the tile order reversed in the second. Tiles: WS_RA,
# WS2, the direct tile quantized afterwards (DQA) and quantizing in its last CTA with row_amax (DRA), v1's TN=8 ring
# with row_amax (RRA, auto's fallback where ws does not fit K). Then memcheck and racecheck on a tiny sweep of DRA.
# Usage (repo root; carry .whl, .tkcache_moe): OUT=$OUT [BUDGET=200] bash profiling/device/run_gpu_checks_moe_t1_direct.sh
#   .tkcache_moe: as run_gpu_checks_moe_fallback.sh's, then TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_moe python
#   profiling/moe_prebuild.py --tables auto --no-extras --tiles "$WS_RA;$WS2;$DQA;$DRA;$RRA" (below) qwen3-30b-a3b
#   qwen3-235b-a22b tiny
#   -> $OUT/moe_t1_direct.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_t1_direct 200
WS_RA="tile_tokens=8,stages=5,min_blocks=3,warpgroups=1,variant=ws,chunks_per_stage=2,row_amax=1"
WS2="tile_tokens=8,stages=5,min_blocks=2,warpgroups=2,variant=ws,chunks_per_stage=2"
DQA="tile_tokens=8,stages=1,min_blocks=8,warpgroups=1,weights_direct=3,quantize_after=1"
DRA="tile_tokens=8,stages=1,min_blocks=8,warpgroups=1,weights_direct=3,row_amax=1"
RRA="tile_tokens=8,stages=8,fused_min_blocks=4,row_amax=1"
head -2 "$DIR/machine.log" | tail -1

for shape in qwen3-30b-a3b qwen3-235b-a22b; do
  moe_sweep_rounds "$DIR" "$shape" 60 "$WS_RA;$WS2;$DQA;$DRA;$RRA" --shape "$shape" --tokens 1,2 --check-bitwise
done
for tool in memcheck racecheck; do
  limit=$(( $(left) - 5 )); [ "$limit" -gt 40 ] && limit=40
  [ "$limit" -gt 15 ] && sanitize "$tool" "$limit" "$DIR/${tool}_sweep.log" python3 profiling/sweep_moe_gemm_tiles.py \
    --shape tiny --tokens 1,8 --tiles "$DRA" --reps 1 --out "$DIR/${tool}_sweep.json"
done
echo "== done ($(left)s left)"
