#!/usr/bin/env bash
# The prefill ring with each k16 step's wgmma its own commit group (TileConfig.step_pipeline, moe_gemm.cuh STEP_PIPE;
# thirty-seventh session) against auto's ring, in one call (BUDGET s): a warpgroup dequantizes a chunk's step j as soon
# as the previous chunk's step j has completed, instead of waiting for all four of its wgmmas (the wait that held 24-30%
# of the prefill GEMMs' warp samples). sweep_moe_gemm_tiles.py at T=4096 / 16384 on Qwen3-30B-A3B and Qwen3-235B-A22B,
# each tile as the fused gate_up (quantized afterwards) and the down GEMM + combine, --check-bitwise (every output
# bitwise equal to auto's ring: all tilings give the same bits), two rounds with the tile order reversed in the second;
# then memcheck on one small sweep of the new tile.
# Usage (repo root; carry .whl, .tkcache_bench): OUT=$OUT [BUDGET=560] bash profiling/device/run_gpu_checks_step_pipeline.sh
#   .tkcache_bench: the sweep's kernels, e.g. TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_bench python profiling/moe_prebuild.py
#   --tables v1 --no-extras --tiles "$A;$B" qwen3-30b-a3b qwen3-235b-a22b (A, B below)
#   -> $OUT/step_pipeline.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call step_pipeline 560 .tkcache_bench
A="tile_tokens=128,stages=2,chunks_per_stage=2,n_step=16,quantize_after=1,gather_pieces=1"
B="$A,step_pipeline=1"

for round in 1 2; do
  tiles="$A;$B"; [ "$round" = 2 ] && tiles="$B;$A"
  for shape in qwen3-30b-a3b qwen3-235b-a22b; do
    limit=$(( $(left) - 30 )); [ "$limit" -gt 90 ] && limit=90
    [ "$limit" -gt 15 ] || { echo "skip round $round $shape: $(left)s left"; continue; }
    moe_sweep "$DIR/sweep_${shape}_round$round.json" "$DIR/sweep_${shape}_round$round.log" "$limit" --shape "$shape" \
      --tokens 4096,16384 --tiles "$tiles" --check-bitwise
  done
done
limit=$(( $(left) - 5 )); [ "$limit" -gt 90 ] && limit=90
[ "$limit" -gt 20 ] && sanitize memcheck "$limit" "$DIR/memcheck_sweep.log" python3 profiling/sweep_moe_gemm_tiles.py \
  --shape qwen3-30b-a3b --tokens 300 --tiles "$B" --reps 1 --out "$DIR/memcheck_sweep.json"
echo "== done ($(left)s left)"
