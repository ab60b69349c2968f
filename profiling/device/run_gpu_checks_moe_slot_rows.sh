#!/usr/bin/env bash
# The down GEMM's per-slot rows as FP16 pairs (moe_slot_rows.cuh; forty-seventh session; b904888 ran it on the first
# trial, an exponent per 16 columns) instead of FP32: 2.5 bytes a value for the down GEMM to write and the combine to
# read back. One call (BUDGET s):
#   1. both trees' auto kernels of both presets (a check of the carried cache)
#   2. the layer, this tree against BASE (.ab_base: db21a3d's FP32 rows), two rounds of bench_moe_tree in turn,
#      T = 1, 64, 256, 1024, 4096, 16384
#   3. the MoE GPU tests (every tiling's stored rows against the exact ones, the combine alone bitwise against the
#      reference, batch invariance, the fused combine, graphs) and the RL layer's GPU tests (the engine's moe_down)
#   4. memcheck and racecheck on the tiny down GEMM over every tiling and on the combine kernel's own test
# Usage (repo root; carry .whl, .tkcache_moe, .ab_base): TRACE_KERNELS_BENCH_COMMIT=<commit> OUT=$OUT [BUDGET=560] \
#     bash profiling/device/run_gpu_checks_moe_slot_rows.sh
#   .ab_base: git archive db21a3d python cuda codegen profiling/bench_moe_gemm.py profiling/sweep_moe_gemm_tiles.py
#     profiling/moe_gemm_ncu_case.py profiling/moe_prebuild.py | tar -x -C .ab_base
#   .tkcache_moe: python profiling/prebuild_device_caches.py --cache .tkcache_moe moe_tests engine, then the base tree's
#     auto kernels of both presets copied in (moe_prebuild.kernel_specs(..., ("auto",), extras=False) built with
#     PYTHONPATH=.ab_base/python; 41 entries, 4.2 MiB)
#   (CHECKS=0: steps 1 and 2 only, e.g. BUDGET=200 (two rounds: step 2's first pair needs 330 s left) with
#    TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_quick holding just both trees' auto kernels: a layer A/B of an epilogue
#    change before the tests' 400 kernels are rebuilt)
#   -> $OUT/moe_slot_rows.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_slot_rows 560
BASE=${BASE:-.ab_base}

moe_prebuild_trees "$DIR" auto "qwen3-30b-a3b qwen3-235b-a22b" "$BASE"
moe_tree_ab "$DIR" moe_slot_rows 1,64,256,1024,4096,16384 100 "$BASE" 330
if [ "${CHECKS:-1}" = 0 ]; then
  moe_tree_ab "$DIR" moe_slot_rows_more 1,64,256,1024,4096,16384 100 "$BASE" 60
  echo "== done ($(left)s left)"
  exit 0
fi
limit=$(( $(left) - 150 )); [ "$limit" -gt 150 ] && limit=150
[ "$limit" -gt 30 ] && gpu_tests "$limit" "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
limit=$(( $(left) - 100 )); [ "$limit" -gt 90 ] && limit=90
[ "$limit" -gt 30 ] && gpu_tests "$limit" "$DIR/rl_gpu_tests.log" -m gpu tests/rl
limit=$(( ($(left) - 5) / 2 )); [ "$limit" -gt 60 ] && limit=60
for tool in memcheck racecheck; do
  [ "$limit" -gt 15 ] && sanitize "$tool" "$limit" "$DIR/sanitizer_$tool.log" python3 -m pytest -q \
    -p no:cacheprovider tests/gpu/test_moe_gemm.py -k "(test_down_combine and tiny and 64) or test_combine_kernel"
done
echo "== done ($(left)s left)"
