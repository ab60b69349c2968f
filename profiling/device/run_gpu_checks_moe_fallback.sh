#!/usr/bin/env bash
# auto's per-kind fallback below 1/8 routed row per expert at a K the ws stages cannot take (K % 128 != 0: gpt-oss's
# H = I = 2880; forty-sixth session), checked in one call (BUDGET s):
#   1. sweep_moe_gemm_tiles.py at gpt-oss-20b's shape (E=32, H=I=2880, top-4), T=1 (1/8 row per expert: the ws rows,
#      which fall back) and T=2, fused gate_up / down GEMM + combine, --check-bitwise, two rounds with the tile order
#      reversed in the second. Tiles: OLD, the fallback before (v1's generic TN=8 ring as 8 stages of 1 chunk, two
#      warpgroups, the fused gate_up quantizing in its last CTA), OLD with row_amax, NEW (auto's next row: the
#      one-warpgroup TN=8 ring quantized afterwards; the down GEMM's next row, DOWN below), the one-warpgroup ring
#      quantizing in-kernel with row_amax, and DOWN (the weights_direct decode tile, its gate_up quantized afterwards)
#   2. the same at gpt-oss-120b's shape (E=128, T=1 and 2; its tuned table runs NEW there), while time is left
#   3. the odd-chunk GPU test (its top-1 T=1 case runs the fallback), memcheck and racecheck on that case, and the RL layer's GPU
#      tests (a check of the whole tree: the engine's test models never reach the fallback, the K = 64 one having at
#      least 1/4 routed row per expert and the other a K the ws tiles take)
# First call (an H100, profiling/results/moe_fallback_h100_*): OLD_RA was the fastest fused gate_up of the fallbacks
# and OLD the fastest down GEMM at T=1, so auto's fallback is OLD with the ws tile's row_amax (auto_fallback).
# Usage (repo root; carry .whl, .tkcache_moe): OUT=$OUT [BUDGET=380] bash profiling/device/run_gpu_checks_moe_fallback.sh
#   .tkcache_moe: prebuild_device_caches.py --cache .tkcache_moe moe_tests engine (the engine's new fallback tiles), then
#   TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_moe python profiling/moe_prebuild.py --tables auto --no-extras \
#     --tiles "$OLD;$OLD_RA;$NEW;$ONE_WG_RA;$DOWN" (below) E=32,H=2880,I=2880,k=4,hq=64,hkv=8,hd=64 \
#     E=128,H=2880,I=2880,k=4,hq=64,hkv=8,hd=64
#   -> $OUT/moe_fallback.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_fallback 380
OLD="tile_tokens=8,stages=8,fused_min_blocks=4"
OLD_RA="$OLD,row_amax=1"
NEW="tile_tokens=8,stages=4,min_blocks=4,warpgroups=1,quantize_after=1"
ONE_WG_RA="tile_tokens=8,stages=4,min_blocks=4,warpgroups=1,row_amax=1"
DOWN="tile_tokens=8,stages=1,min_blocks=8,warpgroups=1,weights_direct=3,quantize_after=1"
head -2 "$DIR/machine.log" | tail -1  # (the card)

for shape in E=32,H=2880,I=2880,k=4,hq=64,hkv=8,hd=64 E=128,H=2880,I=2880,k=4,hq=64,hkv=8,hd=64; do
  label=$([ "${shape:0:4}" = E=32 ] && echo 20b || echo 120b)
  reserve=$([ "$label" = 20b ] && echo 100 || echo 230)  # (120b's rounds give way to the checks below)
  moe_sweep_rounds "$DIR" "$label" "$reserve" "$OLD;$OLD_RA;$NEW;$ONE_WG_RA;$DOWN" --shape "$shape" --tokens 1,2 \
    --check-bitwise
done
limit=$(( $(left) - 160 )); [ "$limit" -gt 90 ] && limit=90
[ "$limit" -gt 20 ] && gpu_tests "$limit" "$DIR/odd_chunk_tests.log" tests/gpu/test_moe_gemm.py -k odd_chunk
for tool in memcheck racecheck; do
  limit=$(( $(left) - 100 )); [ "$limit" -gt 60 ] && limit=60
  [ "$limit" -gt 20 ] && sanitize "$tool" "$limit" "$DIR/${tool}_odd_top1.log" python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_moe_gemm.py -k "odd_chunk and 1-1"
done
limit=$(( $(left) - 5 )); [ "$limit" -gt 100 ] && limit=100
[ "$limit" -gt 30 ] && gpu_tests "$limit" "$DIR/rl_gpu_tests.log" -m gpu tests/rl
echo "== done ($(left)s left)"
