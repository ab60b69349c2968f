#!/usr/bin/env bash
# Ran on an H200 on 2026-12-06 (forty-third session) in a compact form (BUDGET=330, TOKENS=1,2,8, no RL tests or
# Nsight Compute; profiling/results/moe_row_amax_h200_*). auto_ra won at T = 1-2 on both presets and auto took
# row_amax; auto_qkra, 3.9-5.1% slower than auto at T = 8, was removed. Its arms are now auto_ra0 (auto as it was)
# and auto; what follows describes the call as first written.
# The fused SwiGLU epilogue's row amax folded by every CTA (TileConfig.row_amax, forty-first session; written, compiled
# and CPU-tested, not yet run on a GPU): each CTA of a token tile adds the max |h| of its part of each row to
# row_amax[row] with an unsigned RED.MAX (moe_nvfp4_row.cuh, fold_row_amax), so the last CTA quantizes each (row, block
# of 16) on its own thread with one L2 round trip, instead of a warp (or half warp) per row reading the row twice (its
# amax, then the rounding) or holding it in registers. auto quantizes in-kernel in the ws gate_up tile at T <= 2 (top-8
# of 128 experts); "auto_ra" is auto with row_amax there, and "auto_qkra" is auto_qk (v1's tiles quantizing in their
# own last CTA too, instead of the quantize kernel after the GEMM: 0.6-6.4% slower than auto at T = 8-256 in the
# fortieth session, by its last CTA's serial tail) with row_amax on every fused gate_up. One call (BUDGET s):
#   1. the kernels: the MoE GPU tests' (with the row_amax extra tiles) and 235B's auto, auto_ra and auto_qkra, the
#      engine tests' models (all in the carried cache)
#   2. the MoE GPU tests (the row_amax tiles against the reference, bitwise against every other tile, their amax buffer
#      left zero), memcheck and racecheck on the tiny layer over every tiling
#   3. the layer, auto against auto_ra and auto_qkra, two rounds with the arms' order reversed (layer_ab_swapped),
#      T = TOKENS (default 1,2,8,32,64,256: from T = 8 auto and auto_ra run the same kernels, the control)
#   4. the RL layer's GPU tests (auto: unchanged kernels; a regression check of the parameter block's new field)
#   5. while time is left: Nsight Compute (NCU_SOURCE=1), one launch each, of the 30B fused gate_up at T=1 in both arms
# Usage (repo root; carry .whl, .tkcache_moe): TRACE_KERNELS_BENCH_COMMIT=<commit> OUT=$OUT [BUDGET=570] \
#     bash profiling/device/run_gpu_checks_moe_row_amax.sh
#   .tkcache_moe: python profiling/prebuild_device_caches.py --cache .tkcache_moe moe_tests engine (moe_tests holds
#     235B's auto, auto_ra and auto_qkra tables)
#   -> $OUT/moe_row_amax.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_row_amax 570

moe_build_ab "$DIR" auto_ra0,auto
prebuild_engine_test_models 60 "$DIR/build_engine.log"; echo "build_engine exit $? (${SECONDS}s)"
limit=$(( $(left) - 330 )); [ "$limit" -gt 130 ] && limit=130
[ "$limit" -gt 30 ] && gpu_tests "$limit" "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
moe_sanitizers "$DIR" 45
layer_ab_swapped "$DIR" 90 150 auto_ra0,auto --tokens "${TOKENS:-1,2,8,32,64,256}"
limit=$(( $(left) - 60 )); [ "$limit" -gt 90 ] && limit=90
[ "$limit" -gt 30 ] && gpu_tests "$limit" "$DIR/rl_gpu_tests.log" -m gpu tests/rl
export NCU_SOURCE=1
for arm in auto_ra0 auto; do
  [ "$(left)" -gt 30 ] || break
  TRACE_KERNELS_MOE_VARIANT=$arm ncu_report "$DIR/ncu_fused_t1_$arm" 25 "gate_up_swiglu_nvfp4.*_ws1_" \
    python3 profiling/moe_gemm_ncu_case.py --shape qwen3-30b-a3b --tokens 1 --repeat 1 --auto-tiles
done
echo "== done ($(left)s left)"
