#!/usr/bin/env bash
# The fortieth session's second change on its own: the one-warpgroup ws gate_up tile (auto's at T <= 2) holding the rows
# its last CTA quantizes in registers. It took the epilogue's code from ~2.7k to ~6.3k SASS instructions, and Nsight
# Compute's one cold-cache launch had the 30B T=1 fused gate_up at 31.6k cycles against 27.8k before the session, while
# the graph-timed layer rounds had it level or faster. One call (BUDGET s), this tree against BASE (.ab_base: this
# tree's python/, cuda/, codegen/ and scripts with the held rows off, i.e. the acq_rel handshake alone):
#   1. the kernels (the carried cache holds both trees' auto kernels of both presets)
#   2. the layer, four rounds of bench_moe_tree (auto) in turn, T = 1, 2
#   3. Nsight Compute (ncu_report, NCU_SOURCE=1), one launch each, of the fused gate_up of both trees: 30B T=1 and 235B
#      T=2 (the largest gain of the session's first call)
# Usage (repo root; carry .whl, .tkcache_moe, .ab_base): TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_moe \
#     TRACE_KERNELS_BENCH_COMMIT=<commit> OUT=$OUT [BUDGET=330] bash profiling/device/run_gpu_checks_moe_held_rows.sh
#   .ab_base: git archive HEAD python cuda codegen profiling/bench_moe_gemm.py profiling/sweep_moe_gemm_tiles.py
#     profiling/moe_gemm_ncu_case.py profiling/device/gpu_env.sh, kHoldRows = TN >= 64 in its moe_gemm_ws.cuh; its ws
#     kernels: PYTHONPATH=.ab_base/python python profiling/moe_prebuild.py --tables auto --no-extras qwen3-30b-a3b
#     qwen3-235b-a22b, into the same cache
#   -> $OUT/moe_held_rows.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_held_rows 330
BASE=${BASE:-.ab_base}

moe_build 60 "$DIR/build_new.log" --tables auto --no-extras qwen3-30b-a3b qwen3-235b-a22b
moe_tree_ab "$DIR" moe_held_rows 1,2 60 "$BASE" 120
moe_tree_ab "$DIR" moe_held_rows_more 1,2 60 "$BASE" 120
export NCU_SOURCE=1
for tree in new base; do
  for case in "qwen3-30b-a3b 1 t1" "qwen3-235b-a22b 2 t2_235b"; do
    read -r shape tokens label <<< "$case"
    [ "$(left)" -gt 40 ] || break
    if [ "$tree" = new ]; then
      ncu_report "$DIR/ncu_fused_${label}_new" 40 "gate_up_swiglu_nvfp4.*_ws1_" \
        python3 profiling/moe_gemm_ncu_case.py --shape "$shape" --tokens "$tokens" --repeat 1 --auto-tiles
    else
      PYTHONPATH=/tmp/site:$PWD/$BASE/python:$PWD/rl ncu_report "$DIR/ncu_fused_${label}_base" 40 \
        "gate_up_swiglu_nvfp4.*_ws1_" \
        python3 "$BASE/profiling/moe_gemm_ncu_case.py" --shape "$shape" --tokens "$tokens" --repeat 1 --auto-tiles
    fi
  done
done
echo "== done ($(left)s left)"
