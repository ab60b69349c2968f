#!/usr/bin/env bash
# Issue 4, one H200 call (< 7 min): the v1 decode table of 2026-12-02's fourth session (TN=8 as 2 stages of
# 4 K chunks, TN=16 from 6 to 12 routed rows per expert) on the unrolled v1 main loop
#   (1) every MoE GPU test; the engine's GPU tests; memcheck and racecheck on the tiny fused gate_up and down
#   (2) bench_moe_gemm --variants auto, T = 1 .. 16384, both presets (copy and BF16 in the same run)
#   (3) bench_rollout --quick
# Usage (repo root, carry .whl and a JIT cache): OUT=$OUT bash profiling/device/run_gpu_checks_moe_tables4.sh
set -uo pipefail
OUT=${OUT:-runs/moe_tables4}
BUDGET=${BUDGET:-450}
A="$OUT/mt4"
mkdir -p "$A"
source profiling/device/gpu_env.sh "$A/setup.log"
tar_on_exit "$A"

gpu_tests 100 "$A/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
gpu_tests 100 "$A/engine_gpu_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_engine.py -m gpu
moe_sanitizers "$A" 70
timeout 100 python3 profiling/bench_moe_gemm.py --variants auto --tokens 1,8,32,64,128,256,1024,4096,16384 \
  --reps 10 --out "$A/moe_gemm_h200_decode_tables4.json" > "$A/bench.log" 2>&1
echo "bench exit $? (${SECONDS}s)"; grep -E "^qwen3\S+ +[0-9]" "$A/bench.log"
limit=$(( $(left) - 5 ))
timeout "$limit" python3 profiling/bench_rollout.py --quick --out "$A/rollout_h200_quick_tables4.json" > "$A/rollout.log" 2>&1
echo "rollout exit $? (${SECONDS}s)"; grep -E "decode .* tok/s|x$|nvfp4 / bf16" "$A/rollout.log" | tail -8
