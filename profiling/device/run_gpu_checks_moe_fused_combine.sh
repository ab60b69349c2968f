#!/usr/bin/env bash
# The combine in the down GEMM's epilogue (fused_combine, A/B table auto_cb) with every slot's loads in flight
# (sixty-first session). Its SASS (nvcc 13.0) loaded each slot's row index and 16-column block in turn, one thread per
# block, at the direct tile's 64 registers; now one thread per quarter block (combine_quarter: 8 + 2 bytes per slot)
# issues all 8 slots' loads before the first sum, the same bits. Also, on an H200, the layer table's refresh.
# One call (BUDGET s):
#   1. this tree's auto and auto_cb kernels, both presets (a check of the carried cache)
#   2. CHECKS=1 (default): the fused combine's GPU test (every combining tile bitwise equal to the combine kernel, the
#      counters left zero), then memcheck and racecheck on it at T=8
#   3. AB=1 (default): the layer, auto against auto_cb in one process, two rounds with the arms swapped
#      (TOKENS, default 1,2,4,8,16,32,64: at T <= 2 both run the ws down tile and the combine kernel, a control)
#   4. on an H200 with REFRESH=1 (default): issue 4's whole token list, this tree and MID (.ab_mid: 5656b24, the tree of
#      the last H200 table) in turn, the order swapped every round, while 110 s are left
# Usage (repo root; carry .whl, .tkcache_rf, .ab_mid): OUT=$OUT [BUDGET=560] bash \
#     profiling/device/run_gpu_checks_moe_fused_combine.sh
#   .ab_mid: git archive 5656b24 python cuda codegen profiling/bench_moe_gemm.py profiling/sweep_moe_gemm_tiles.py
#     profiling/moe_gemm_ncu_case.py profiling/moe_prebuild.py | tar -x -C .ab_mid
#   .tkcache_rf: TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_rf python profiling/moe_prebuild.py --tables auto,auto_cb
#     --no-extras qwen3-30b-a3b qwen3-235b-a22b; the same for MID's auto table (PYTHONPATH=.ab_mid/python python
#     .ab_mid/profiling/moe_prebuild.py --tables auto ...); the fused combine test's 30B down kernels (the rest build
#     there)
#   -> $OUT/moe_fused_combine.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_fused_combine 560 .tkcache_rf
MID=${MID:-.ab_mid}
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
h200=0; [[ "$card" == *H200* && "${REFRESH:-1}" = 1 ]] && h200=1

moe_build 120 "$DIR/build_new.log" --tables auto,auto_cb --no-extras qwen3-30b-a3b qwen3-235b-a22b
if [ "${CHECKS:-1}" = 1 ]; then
  gpu_tests 120 "$DIR/combine_tests.log" tests/gpu/test_moe_gemm.py -k "fused_combine or combine_kernel_equals"
  for tool in memcheck racecheck; do
    sanitize "$tool" 60 "$DIR/sanitizer_$tool.log" python3 -m pytest -q -p no:cacheprovider \
      tests/gpu/test_moe_gemm.py -k "test_fused_combine_equals_the_combine_kernel and 8"
  done
fi
[ "${AB:-1}" = 1 ] && layer_ab_swapped "$DIR" 150 160 auto,auto_cb --tokens "${TOKENS:-1,2,4,8,16,32,64}"
if [ "$h200" = 1 ]; then
  PYTHONPATH=/tmp/site:$PWD/$MID/python:$PWD/rl timeout 120 python3 "$MID/profiling/moe_prebuild.py" --tables auto \
    --no-extras qwen3-30b-a3b qwen3-235b-a22b > "$DIR/build_mid.log" 2>&1
  echo "mid build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_mid.log"
  for round in 1 2; do
    trees="new base"; [ "$round" = 2 ] && trees="base new"
    for tree in $trees; do
      [ "$(left)" -lt 110 ] && break 2
      bench_moe_tree "$tree" "$DIR" moe_refresh "$round" 1,8,32,64,128,256,1024,4096,16384 150 "$MID"
    done
  done
fi
echo "== done ($(left)s left)"
