#!/usr/bin/env bash
# v1's token rows in two halves (fifty-fifth session): the source rows before the first activation copies, the output
# scales and router weights after them, so a CTA's first activations wait for one round trip (the row index; none in
# the down GEMM) instead of two (then the row scale). The values and the kernels' outputs are the same bits. One call
# (BUDGET s), this tree against BASE (.ab_base: 6e8b6de, before the change):
#   1. both trees' auto kernels of both presets (a check of the carried cache)
#   2. the layer, this tree against BASE, two rounds of bench_moe_tree in turn, T = 1, 8, 32, 64, 128, 256, 1024
#   3. the MoE GPU tests (every tiling against the reference and bitwise against the others, batch invariance, graphs)
#   4. memcheck and racecheck on the tiny fused gate_up and down GEMMs over every tiling
# Usage (repo root; carry .whl, .tkcache_early, .ab_base): OUT=$OUT [BUDGET=560] [CHECKS=0] \
#     bash profiling/device/run_gpu_checks_moe_early_rows.sh
#   .ab_base: git archive 6e8b6de python cuda codegen profiling/bench_moe_gemm.py profiling/sweep_moe_gemm_tiles.py
#     profiling/moe_gemm_ncu_case.py profiling/moe_prebuild.py | tar -x -C .ab_base
#   .tkcache_early: python profiling/prebuild_device_caches.py --cache .tkcache_early moe_tests, then both trees' auto
#     kernels of both presets (moe_prebuild.py --tables auto --no-extras qwen3-30b-a3b qwen3-235b-a22b, the base tree's
#     with PYTHONPATH=.ab_base/python and its own moe_prebuild.py)
#   (CHECKS=0: steps 1 and 2 only, and a third and fourth round while more than 60 s are left; AB_MIN_LEFT: the seconds
#    a pair of step 2's runs needs left to start, default 300)
#   -> $OUT/moe_early_rows.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_early_rows 560 .tkcache_early
BASE=${BASE:-.ab_base}

moe_prebuild_trees "$DIR" auto "qwen3-30b-a3b qwen3-235b-a22b" "$BASE"
moe_tree_ab "$DIR" moe_early_rows 1,8,32,64,128,256,1024 100 "$BASE" "${AB_MIN_LEFT:-300}"
if [ "${CHECKS:-1}" = 0 ]; then
  moe_tree_ab "$DIR" moe_early_rows_more 1,8,32,64,128,256,1024 100 "$BASE" 60
  echo "== done ($(left)s left)"
  exit 0
fi
limit=$(( $(left) - 90 )); [ "$limit" -gt 150 ] && limit=150
[ "$limit" -gt 30 ] && gpu_tests "$limit" "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
moe_sanitizers_left "$DIR" 50
echo "== done ($(left)s left)"
