#!/usr/bin/env bash
# v1's CTA start without the second lookup (fifty-seventh session): warp 0 finds the CTA's expert, first row and
# valid rows during its scan of the offsets (find_token_tile), so one barrier precedes the weight requests instead of
# two and the offsets are read once; and moe_combine requests slot_rows before its wait for the down GEMM. The
# kernels' outputs are the same bits. One call (BUDGET s), this tree against BASE (.ab_base: 1ba4fb3, before it):
#   1. both trees' auto kernels of both presets (a check of the carried cache)
#   2. the layer, this tree against BASE (and MID, when set), four rounds of bench_moe_tree in turn, T = 1, 8, 32, 64,
#      128, 256, 1024 (JSON moe_start_lookup_{new,base}ROUND.json; MID's moe_start_lookup_basemROUND.json)
#   3. the MoE GPU tests (every tiling against the reference and bitwise against the others, batch invariance, graphs,
#      the programmatic dependent launches against plain ones)
#   4. memcheck and racecheck on the tiny fused gate_up and down GEMMs over every tiling
#   5. the prefill rows (T = 4096, 16384), this tree against BASE, up to four rounds while 60 s are left
# Usage (repo root; carry .whl, .tkcache_lookup, .ab_base): OUT=$OUT [BUDGET=560] bash \
#     profiling/device/run_gpu_checks_moe_start_lookup.sh
#   .ab_base: git archive 1ba4fb3 python cuda codegen profiling/bench_moe_gemm.py profiling/sweep_moe_gemm_tiles.py
#     profiling/moe_gemm_ncu_case.py profiling/moe_prebuild.py | tar -x -C .ab_base
#   .tkcache_lookup: python profiling/prebuild_device_caches.py --cache .tkcache_lookup moe_tests first (it keeps only
#     the newest entry of each kernel name), then both trees' auto kernels of both presets (moe_prebuild.py --tables
#     auto --no-extras qwen3-30b-a3b qwen3-235b-a22b, the base tree's with PYTHONPATH=.ab_base/python and its own
#     moe_prebuild.py)
#   (CHECKS=0: steps 1 and 2 only. AB_MIN_LEFT: the seconds a round of step 2 needs left to start, default 200; above
#    BUDGET, step 2 is skipped.
#    MID: a third tree, e.g. .ab_mid, git archive 6c9863a as above (slot_rows by ld.cg, the first call's tree), whose
#    auto kernels the cache holds too. Another cache: TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_ldg)
#   -> $OUT/moe_start_lookup.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_start_lookup 560 .tkcache_lookup
BASE=${BASE:-.ab_base}
MID=${MID:-}

moe_prebuild_trees "$DIR" auto "qwen3-30b-a3b qwen3-235b-a22b" "$BASE"
[ -n "$MID" ] && cp "$DIR/build_base.log" "$DIR/build_base_only.log" &&
  moe_prebuild_trees "$DIR" auto "qwen3-30b-a3b qwen3-235b-a22b" "$MID"
for round in 1 2 3 4; do
  [ "$(left)" -lt "${AB_MIN_LEFT:-200}" ] && break
  bench_moe_tree new "$DIR" moe_start_lookup "$round" 1,8,32,64,128,256,1024 100 "$BASE"
  bench_moe_tree base "$DIR" moe_start_lookup "$round" 1,8,32,64,128,256,1024 100 "$BASE"
  [ -n "$MID" ] && bench_moe_tree base "$DIR" moe_start_lookup "m$round" 1,8,32,64,128,256,1024 100 "$MID"
done
[ "${CHECKS:-1}" = 0 ] && { echo "== done ($(left)s left)"; exit 0; }
limit=$(( $(left) - 100 )); [ "$limit" -gt 150 ] && limit=150
[ "$limit" -gt 30 ] && gpu_tests "$limit" "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
moe_sanitizers_left "$DIR" 90
for round in 1 2 3 4; do
  [ "$(left)" -lt 60 ] && break
  bench_moe_tree new "$DIR" moe_start_lookup_prefill "$round" 4096,16384 50 "$BASE"
  bench_moe_tree base "$DIR" moe_start_lookup_prefill "$round" 4096,16384 50 "$BASE"
done
echo "== done ($(left)s left)"
