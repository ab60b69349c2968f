#!/usr/bin/env bash
# Deeper ws rings below 1/8 routed row per expert (thirty-ninth session). At T=1 on Qwen3-30B-A3B the ws GEMMs stream
# at ~1 TB/s (Nsight Compute on an H100, run_gpu_checks_moe_t1_ncu.sh: the plain gate_up 11.9 us for 14 MB with its
# consumers waiting on full barriers): each of the 192 CTAs walks its 32 K chunks with 10 in flight (5 stages of 2).
# Do more chunks in flight per CTA (8 / 12 / 16 stages of 2 at 2 CTAs/SM with one consumer warpgroup; 6 stages at 2 and
# 12 at 1 CTA/SM with two) shorten it? sweep_moe_gemm_tiles.py on both presets at T = 1, 2, 4: fused gate_up and down
# GEMM + combine timed apart (CUDA graphs, L2 flushed, median of 10), outputs checked bitwise against the first tile
# (auto's gate_up tile there); the first two tiles are auto's gate_up and down tiles at T <= 2.
# Usage (repo root; carry .whl, .tkcache_moe): OUT=$OUT [BUDGET=300] bash profiling/device/run_gpu_checks_moe_ws_deep_ring.sh
#   -> $OUT/moe_ws_deep_ring.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_ws_deep_ring 300

TILES="variant=ws,tile_tokens=8,stages=5,min_blocks=3,warpgroups=1,chunks_per_stage=2;\
variant=ws,tile_tokens=8,stages=5,min_blocks=2,warpgroups=2,chunks_per_stage=2;\
variant=ws,tile_tokens=8,stages=8,min_blocks=2,warpgroups=1,chunks_per_stage=2;\
variant=ws,tile_tokens=8,stages=12,min_blocks=2,warpgroups=1,chunks_per_stage=2;\
variant=ws,tile_tokens=8,stages=16,min_blocks=2,warpgroups=1,chunks_per_stage=2;\
variant=ws,tile_tokens=8,stages=6,min_blocks=2,warpgroups=2,chunks_per_stage=2;\
variant=ws,tile_tokens=8,stages=12,min_blocks=1,warpgroups=2,chunks_per_stage=2"
for shape in qwen3-30b-a3b qwen3-235b-a22b; do
  [ "$(left)" -gt 60 ] && moe_sweep "$DIR/sweep_$shape.json" "$DIR/sweep_$shape.log" 120 --shape "$shape" \
    --tokens 1,2,4 --tiles "$TILES" --check-bitwise
done
echo "== done ($(left)s left)"
