#!/usr/bin/env bash
# moe_combine with every slot's loads in flight at once (sixtieth session). Its SASS (nvcc 13.0) issued a slot's
# per-slot-row loads only after the previous slot's sum: with no minimum CTAs per SM ptxas kept the kernel at 48
# registers, so a token's 8 slots cost ~6 chained L2 round trips, and at decode the combine is that chain (the
# fifty-ninth session's timeline: 2.4 us from its wait to its end at 30B T=8). Now the kernel is bounded to 128
# registers (105 used), one thread per 16-column block: the same bits, the loads issued together.
# The call of the sixtieth session ran this script at d90eae8, whose step 4 also timed the same bound on the decode
# attention's split combine (bench_attention.py --decode-only on both trees; no change beyond the runs' spread, not kept).
# One call (BUDGET s):
#   1. the auto kernels of this tree and BASE (.ab_base: 316cac0, before it), both presets (a check of the cache)
#   2. AB=1 (default): four rounds of the layer benchmark, this tree and BASE in turn, the order swapped every round
#   3. TIMELINE=1 (default): the timeline's GPU tests (the refactor of 316cac0 too) and profiling/moe_timeline.py at
#      T = 8, 64 (stamped cubins carried in .tkstamped): the combine's time from its wait to its end
#   4. CHECKS=1 (default): the MoE GPU tests' kernels built there (16 jobs; serially inside pytest they outlast the
#      call), then the combine kernel's GPU tests (every H case), the down GEMM + combine and fused-combine tests, the
#      PDL and CUDA-graph layer tests, then memcheck and racecheck on the combine kernel's test
# Usage (repo root; carry .whl, .tkcache_cb, .ab_base, .tkstamped): OUT=$OUT [BUDGET=560] bash \
#     profiling/device/run_gpu_checks_moe_combine_loads.sh
#   .ab_base: git archive 316cac0 python cuda codegen profiling/bench_moe_gemm.py profiling/sweep_moe_gemm_tiles.py
#     profiling/moe_gemm_ncu_case.py profiling/moe_prebuild.py | tar -x -C .ab_base
#   .tkcache_cb: TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_cb python profiling/moe_prebuild.py --tables auto --no-extras
#     qwen3-30b-a3b qwen3-235b-a22b, the same with BASE (PYTHONPATH=.ab_base/python python
#     .ab_base/profiling/moe_prebuild.py ...) and whatever of the tests' kernels it holds (the rest build there)
#   .tkstamped: python profiling/moe_timeline.py --build-only --shapes tiny,qwen3-30b-a3b,qwen3-235b-a22b
#     --stamped-dir .tkstamped
#   -> $OUT/moe_combine_loads.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_combine_loads 560 .tkcache_cb
BASE=${BASE:-.ab_base}

moe_prebuild_trees "$DIR" auto "qwen3-30b-a3b qwen3-235b-a22b" "$BASE"
if [ "${AB:-1}" = 1 ]; then
  for round in 1 2 3 4; do
    trees="new base"; [ $((round % 2)) = 0 ] && trees="base new"
    for tree in $trees; do
      [ "$(left)" -lt "${AB_MIN_LEFT:-200}" ] && break 2
      bench_moe_tree "$tree" "$DIR" moe_combine_loads "$round" "${TOKENS:-1,2,8,64,256,1024,16384}" 100 "$BASE"
    done
  done
fi
if [ "${TIMELINE:-1}" = 1 ] && [ "$(left)" -gt 100 ]; then
  export TRACE_KERNELS_TIMELINE_CUBINS=$PWD/.tkstamped
  gpu_tests 60 "$DIR/timeline_tests.log" tests/gpu/test_moe_timeline.py tests/test_profiling_moe_timeline.py
  timeout 60 python3 profiling/moe_timeline.py --tokens 8,64 --samples 3 --stamped-dir "$PWD/.tkstamped" \
    --out "$DIR/moe_timeline_combine_loads.json" > "$DIR/moe_timeline.log" 2>&1
  echo "moe_timeline exit $?"; grep -E "^qwen3|^  (down|combine)" "$DIR/moe_timeline.log" | cut -c1-200
fi
[ "${CHECKS:-1}" = 0 ] && { echo "== done ($(left)s left)"; exit 0; }
moe_build 170 "$DIR/build_tests.log" tiny qwen3-30b-a3b  # (the tests' kernels, 16 jobs: 387 in 138 s on an H100's host)
limit=$(( $(left) - 60 )); [ "$limit" -gt 120 ] && limit=120
[ "$limit" -gt 30 ] && gpu_tests "$limit" "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py \
  -k "combine or test_programmatic_dependent_launches_equal_plain_ones or test_cuda_graph_replay_matches_eager"
for tool in memcheck racecheck; do
  limit=$(( ($(left) - 5) / 2 )); [ "$tool" = racecheck ] && limit=$(( $(left) - 5 )); [ "$limit" -gt 60 ] && limit=60
  [ "$limit" -gt 15 ] && sanitize "$tool" "$limit" "$DIR/sanitizer_$tool.log" python3 -m pytest -q \
    -p no:cacheprovider tests/gpu/test_moe_gemm.py -k "test_combine_kernel_equals_reference"
done
echo "== done ($(left)s left)"
