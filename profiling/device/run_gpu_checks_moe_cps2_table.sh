#!/usr/bin/env bash
# Issue 4, one H200 call (< 9 min): the v1 TN=8 table tile as 4 stages of two K chunks (chunks_per_stage=2),
# after the unrolled main loop (run_gpu_checks_moe_unrolled.sh)
#   (1) every MoE GPU test; the engine's GPU tests (their K=64 shape runs the same ring as one-chunk stages)
#   (2) compute-sanitizer memcheck and racecheck on the tiny fused gate_up and down tests (every tiling)
#   (3) bench_moe_gemm, auto and v1 tables, T = 1 .. 16384, both presets, the off-table tiles at T = 8 and 64
#       (among them the previous TN=8 table tile, with and without quantize_after), twice for T <= 256
#   (4) bench_rollout --quick; Nsight Compute on the 30B T=64 fused gate_up
# Usage (repo root, carry .whl and a JIT cache): OUT=$OUT bash profiling/device/run_gpu_checks_moe_cps2_table.sh
set -uo pipefail
OUT=${OUT:-runs/moe_cps2_table}
BUDGET=${BUDGET:-560}
A="$OUT/mct"
mkdir -p "$A"
source profiling/device/gpu_env.sh "$A/setup.log"
tar_on_exit "$A"

gpu_tests 120 "$A/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
gpu_tests 100 "$A/engine_gpu_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_engine.py -m gpu
moe_sanitizers "$A" 70

timeout 150 python3 profiling/bench_moe_gemm.py --variants auto,v1 --tokens 1,8,32,64,128,256,1024,4096,16384 \
  --extra-tokens 8,64 --reps 10 --out "$A/moe_gemm_h200_cps2_table.json" > "$A/bench1.log" 2>&1
echo "bench 1 exit $? (${SECONDS}s)"; grep -E "^qwen3\S+ +[0-9]|extra tiles" "$A/bench1.log"
timeout 90 python3 profiling/bench_moe_gemm.py --variants auto,v1 --tokens 8,32,64,128,256 \
  --extra-tokens 8,64 --reps 10 --out "$A/moe_gemm_h200_cps2_table_run2.json" > "$A/bench2.log" 2>&1
echo "bench 2 exit $? (${SECONDS}s)"; grep -E "^qwen3\S+ +[0-9]|extra tiles" "$A/bench2.log"

limit=$(( $(left) - 60 ))
[ "$limit" -gt 40 ] && timeout "$limit" python3 profiling/bench_rollout.py --quick \
  --out "$A/rollout_h200_quick_cps2_table.json" > "$A/rollout.log" 2>&1
echo "rollout exit $? (${SECONDS}s)"; tail -6 "$A/rollout.log"
if [ "$(left)" -gt 45 ]; then
  ncu_report "$A/ncu_moe_cps2_t64" 40 "moe_gemm_gate_up" python3 profiling/moe_gemm_ncu_case.py --shape qwen3-30b-a3b --tokens 64
fi
