#!/usr/bin/env bash
# The down GEMM's weights_direct decode tile below 1/8 routed row per expert too ("auto_dd": auto with the down table's
# ws row dropped; forty-sixth session), against auto's two-warpgroup ws tile there. In the T=1-2 sweep of
# run_gpu_checks_moe_t1_direct.sh (an H100) the direct tile's down GEMM + combine took 7-13% less time on Qwen3-235B-A22B
# at T = 1 and 2 and 8% less on Qwen3-30B-A3B at T=2, 3-4% more at 30B T=1. One call (BUDGET s):
#   1. the layer, auto against auto_dd at T = 1, 2, 4 and 8 (T=8 the control: 1/2 row per expert, the same kernels),
#      both presets, four rounds, the arms' order reversed in every other round (bench_moe_gemm.py, CUDA graphs, L2
#      flushed, median of 10)
#   2. the MoE GPU tests with TRACE_KERNELS_MOE_VARIANT=auto_dd (every call without tile= on its tables), while time is
#      left
# Usage (repo root; carry .whl, .tkcache_moe; auto_dd adds no kernel to auto's):
#   OUT=$OUT [BUDGET=240] bash profiling/device/run_gpu_checks_moe_down_direct.sh
#   -> $OUT/moe_down_direct.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_down_direct 240
head -2 "$DIR/machine.log" | tail -1

moe_build 60 "$DIR/build_235b.log" --tables auto,auto_dd --no-extras qwen3-235b-a22b
arms=auto,auto_dd
for round in 1 2 3 4; do
  [ "$(left)" -lt 100 ] && break
  layer_ab_round "$DIR" "$round" 60 --variants "$arms" --tokens 1,2,4,8
  arms=$(tr ',' '\n' <<< "$arms" | tac | paste -sd,)
done
limit=$(( $(left) - 5 )); [ "$limit" -gt 150 ] && limit=150
[ "$limit" -gt 30 ] && TRACE_KERNELS_MOE_VARIANT=auto_dd gpu_tests "$limit" "$DIR/moe_gpu_tests_auto_dd.log" \
  tests/gpu/test_moe_gemm.py
echo "== done ($(left)s left)"
