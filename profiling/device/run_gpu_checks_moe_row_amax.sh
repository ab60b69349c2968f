#!/usr/bin/env bash
# The fused SwiGLU epilogue's row amax folded by every CTA (forty-first session): each CTA of a token tile adds the max
# |h| of its part of each row to row_amax[row] with an unsigned RED.MAX (moe_nvfp4_row.cuh, fold_row_amax), so the last
# CTA quantizes each (row, block of 16) on its own thread with one L2 round trip, instead of a warp per row reading the
# row twice (its amax, then the rounding). auto runs that epilogue in the ws gate_up tile at T <= 2 (top-8 of 128
# experts); v1's in-kernel path (extra tiles, auto_qk) takes it too. One call (BUDGET s), this tree against BASE
# (.ab_base: the previous commit's python/, cuda/, codegen/ and scripts):
#   1. the kernels: the MoE GPU tests' and 235B auto's, the engine tests' models, and BASE's auto kernels of both
#      presets (all in the carried cache)
#   2. the layer (auto), ROUNDS rounds (default 2), the trees in turn (BASE first in the even ones), T = TOKENS
#      (default 1,2,8: ws tiles at T <= 2; at T = 8 auto's v1 gate_up quantizes in the quantize kernel, the control)
#   3. the MoE GPU tests, the RL layer's GPU tests, memcheck and racecheck on the tiny layer over every tiling
#   4. while time is left: Nsight Compute (NCU_SOURCE=1), one launch each, of both trees' fused gate_up at 30B T=1 and
#      235B T=2
# Usage (repo root; carry .whl, .tkcache_moe, .ab_base): TRACE_KERNELS_BENCH_COMMIT=<commit> OUT=$OUT \
#     [BUDGET=570] bash profiling/device/run_gpu_checks_moe_row_amax.sh
#   .ab_base: rm -rf .ab_base && mkdir .ab_base && git archive BASE_COMMIT python cuda codegen profiling/bench_moe_gemm.py \
#     profiling/sweep_moe_gemm_tiles.py profiling/moe_gemm_ncu_case.py profiling/moe_prebuild.py \
#     profiling/device/gpu_env.sh | tar -x -C .ab_base
#   .tkcache_moe: python profiling/prebuild_device_caches.py --cache .tkcache_moe moe_tests engine, then BASE's
#     PYTHONPATH=.ab_base/python python .ab_base/profiling/moe_prebuild.py --tables auto --no-extras qwen3-30b-a3b
#     qwen3-235b-a22b into the same folder (TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_moe)
#   -> $OUT/moe_row_amax.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_row_amax 570
BASE=${BASE:-.ab_base}

moe_build_ab "$DIR" auto
PYTHONPATH=/tmp/site:$PWD/$BASE/python:$PWD/rl moe_build 60 "$DIR/build_base.log" --tables auto --no-extras \
  qwen3-30b-a3b qwen3-235b-a22b
prebuild_engine_test_models 60 "$DIR/build_engine.log"; echo "build_engine exit $? (${SECONDS}s)"
TOKENS=${TOKENS:-1,2,8}
for round in $(seq 1 "${ROUNDS:-2}"); do
  for tree in $([ $((round % 2)) = 1 ] && echo "new base" || echo "base new"); do
    [ "$(left)" -lt 330 ] && break
    bench_moe_tree "$tree" "$DIR" moe_row_amax "$round" "$TOKENS" 80 "$BASE"
  done
done
moe_and_rl_checks "$DIR" 160 100
export NCU_SOURCE=1
for case in "qwen3-30b-a3b 1 t1" "qwen3-235b-a22b 2 t2_235b"; do
  read -r shape tokens label <<< "$case"
  for tree in new base; do
    [ "$(left)" -gt 40 ] || break
    if [ "$tree" = new ]; then
      ncu_report "$DIR/ncu_fused_${label}_new" 35 "gate_up_swiglu_nvfp4.*_ws1_" \
        python3 profiling/moe_gemm_ncu_case.py --shape "$shape" --tokens "$tokens" --repeat 1 --auto-tiles
    else
      PYTHONPATH=/tmp/site:$PWD/$BASE/python:$PWD/rl ncu_report "$DIR/ncu_fused_${label}_base" 35 \
        "gate_up_swiglu_nvfp4.*_ws1_" \
        python3 "$BASE/profiling/moe_gemm_ncu_case.py" --shape "$shape" --tokens "$tokens" --repeat 1 --auto-tiles
    fi
  done
done
echo "== done ($(left)s left)"
