#!/usr/bin/env bash
# The MoE GEMMs' epilogues without a branch per token column (fifty-ninth session). profiling/moe_timeline.py found the
# prefill CTAs 4.5-4.9 us in their epilogue (of a 22-53 us life), and the SASS shows why: `if (n >= rows_valid)
# continue;` made each of a thread's 32 token columns a branch-guarded block (BSSY / BRA / BSYNC), so each column's
# shared load, MUFU chain and store waited for the previous column's. Now every column is computed (token_scale is 0
# past the expert's end) and only the stores are predicated (store_if.cuh): the same bits, straight-line code.
# One call (BUDGET s):
#   1. the auto kernels of this tree and BASE (.ab_head: 1315f73, before it), both presets (a check of the cache)
#   2. AB=1 (default): four rounds of the layer benchmark, this tree and BASE in turn, the order swapped every round,
#      T = 1 .. 16384
#   3. TIMELINE=1 (default): profiling/moe_timeline.py on this tree at T = 256, 4096, 16384 (stamped cubins carried in
#      .tkstamped2): the epilogue's phase and the SM time with one main loop, against the first call's
#   4. CHECKS=1 (default): the MoE GPU tests, memcheck and racecheck on the tiny fused gate_up and down GEMMs over every
#      tiling, while time is left
# Usage (repo root; carry .whl, .tkcache_si, .ab_head, .tkstamped2): OUT=$OUT [BUDGET=560] bash \
#     profiling/device/run_gpu_checks_moe_store_if.sh
#   .ab_head: git archive 1315f73 python cuda codegen profiling/bench_moe_gemm.py profiling/sweep_moe_gemm_tiles.py
#     profiling/moe_gemm_ncu_case.py profiling/moe_prebuild.py | tar -x -C .ab_head
#   .tkcache_si: python profiling/prebuild_device_caches.py --cache .tkcache_si moe_tests, then BASE's auto kernels
#     (PYTHONPATH=.ab_head/python python .ab_head/profiling/moe_prebuild.py --tables auto --no-extras
#     qwen3-30b-a3b qwen3-235b-a22b with TRACE_KERNELS_CACHE_DIR=.tkcache_si)
#   .tkstamped2: python profiling/moe_timeline.py --build-only --shapes qwen3-30b-a3b,qwen3-235b-a22b
#     --stamped-dir .tkstamped2
#   -> $OUT/moe_store_if.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_store_if 560 .tkcache_si
BASE=${BASE:-.ab_head}

moe_prebuild_trees "$DIR" auto "qwen3-30b-a3b qwen3-235b-a22b" "$BASE"
if [ "${AB:-1}" = 1 ]; then
  for round in 1 2 3 4; do
    trees="new base"; [ $((round % 2)) = 0 ] && trees="base new"
    for tree in $trees; do
      [ "$(left)" -lt "${AB_MIN_LEFT:-200}" ] && break 2
      bench_moe_tree "$tree" "$DIR" moe_store_if "$round" 1,8,64,256,1024,4096,16384 100 "$BASE"
    done
  done
fi
if [ "${TIMELINE:-1}" = 1 ] && [ "$(left)" -gt 60 ]; then
  timeout 60 python3 profiling/moe_timeline.py --tokens 256,4096,16384 --stamped-dir "$PWD/.tkstamped2" \
    --out "$DIR/moe_timeline_store_if.json" > "$DIR/moe_timeline.log" 2>&1
  echo "moe_timeline exit $?"; grep -E "^qwen3|^  (gate_up|down)" "$DIR/moe_timeline.log" | cut -c1-230
fi
[ "${CHECKS:-1}" = 0 ] && { echo "== done ($(left)s left)"; exit 0; }
limit=$(( $(left) - 110 )); [ "$limit" -gt 200 ] && limit=200
[ "$limit" -gt 30 ] && gpu_tests "$limit" "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
moe_sanitizers_left "$DIR" 80
echo "== done ($(left)s left)"
