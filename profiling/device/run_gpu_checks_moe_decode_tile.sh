#!/usr/bin/env bash
# Issue 4, one H200 call (< 4 min): auto's one-warpgroup v1 tile from 1/8 to 1 routed row per expert
#   (1) every MoE GPU test; the rollout engine's GPU tests (their decode steps route through it)
#   (2) bench_moe_gemm --variants auto at T = 1, 8, 16, 32, 64 on both presets (copy and BF16 in the same run)
# Usage (repo root, carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_moe_decode_tile.sh
set -uo pipefail
OUT=${OUT:-runs/moe_decode_tile}
A="$OUT/mdt"
mkdir -p "$A"
BUDGET=300
source profiling/device/gpu_env.sh "$A/setup.log"
tar_on_exit "$A"
gpu_tests 60 "$A/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
gpu_tests 120 "$A/engine_gpu_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_engine.py -m gpu
limit=$(( $(left) - 10 ))
timeout "$limit" python3 profiling/bench_moe_gemm.py --variants auto --tokens 1,8,16,32,64 --reps 10 \
  --out "$A/moe_gemm_h200_decode_tile.json" > "$A/bench.log" 2>&1
echo "bench exit: $? (limit ${limit}s, ${SECONDS}s)"; grep -E "^shape|^qwen3\S+ +[0-9]" "$A/bench.log"
