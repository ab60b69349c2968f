#!/usr/bin/env bash
# The ws kernel's producer requests its first item's first STAGES stages of weights before it waits for the previous
# kernel and before it looks up the item's token rows (thirty-ninth session, commit d11a460's moe_gemm_ws.cuh, as v1 does
# with its first chunks; measured slower on 30B and reverted: docs/moe_gemm.md, "2026-12-05 (thirty-ninth session)".
# The script runs this tree against BASE as they are: to repeat the A/B, check out d11a460's header first). auto runs ws below 1/8 routed row per expert (T <= 2 at top-8 of 128 experts), where Nsight Compute had the
# T=1 GEMMs waiting on fixed costs rather than on their ring. One call (BUDGET s):
#   1. the kernels: the MoE GPU tests' and 235B auto's (the new ws kernels compile here), the engine tests' models
#   2. the layer, this tree against BASE (.ab_base: the previous commit's python/, cuda/, codegen/ and bench script),
#      two rounds, each tree in turn (moe_tree_ab), auto table, T = 1, 2, 4, 8 (T >= 4 runs v1 tiles: the control)
#   3. the MoE GPU tests (every ws tiling against the reference and bitwise against v1; PDL launches against plain ones;
#      persistent grids capped to 1 and 3 CTAs, so later items take the ring after the early ones), the RL layer's GPU
#      tests, memcheck and racecheck on the tiny layer over every tiling (AB_ONLY=1: steps 1-2 alone, four rounds)
# Usage (repo root; carry .whl, .tkcache_moe, .ab_base): TRACE_KERNELS_BENCH_COMMIT=<commit> OUT=$OUT [BUDGET=520] \
#     bash profiling/device/run_gpu_checks_moe_ws_early_weights.sh
#   .ab_base: rm -rf .ab_base && mkdir .ab_base && git archive BASE_COMMIT python cuda codegen \
#     profiling/bench_moe_gemm.py profiling/sweep_moe_gemm_tiles.py profiling/device/gpu_env.sh | tar -x -C .ab_base
#   -> $OUT/moe_ws_early_weights.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_ws_early_weights 520
BASE=${BASE:-.ab_base}

moe_build_ab "$DIR" auto
prebuild_engine_test_models 60 "$DIR/build_engine.log"; echo "build_engine exit $? (${SECONDS}s)"
if [ "${AB_ONLY:-0}" = 1 ]; then
  moe_tree_ab "$DIR" moe_ws_early_weights 1,2,4,8 60 "$BASE" 30
  moe_tree_ab "$DIR" moe_ws_early_weights_more 1,2,4,8 60 "$BASE" 30
  echo "== done ($(left)s left)"; exit 0
fi
moe_tree_ab "$DIR" moe_ws_early_weights 1,2,4,8 60 "$BASE" 250
moe_and_rl_checks "$DIR" 200 110
echo "== done ($(left)s left)"
