#!/usr/bin/env bash
# Issue 4, one H200 call (< 4 min): v1 with an activation ring and a 128-thread barrier per warpgroup
# (TileConfig.wg_local, moe_gemm.cuh WG_LOCAL) on the TN=8 table tile, against the table tile, same run
#   (1) every MoE GPU test (the wg_local tile among the tilings, bitwise); memcheck and racecheck on tiny
#   (2) bench_moe_gemm auto at T = 8, 32, 64 with the off-table tiles at T = 32 and 64
#   (3) the engine's GPU tests with the time left (every v1 kernel was rebuilt)
# The wg_local knob was measured slower (3-3.5%) and removed after this run: check out commit eac6f2e to
# repeat it.
# Usage (repo root, carry .whl and a JIT cache): OUT=$OUT bash profiling/device/run_gpu_checks_moe_wg_local.sh
set -uo pipefail
OUT=${OUT:-runs/moe_wg_local}
BUDGET=${BUDGET:-200}
A="$OUT/mwl"
mkdir -p "$A"
source profiling/device/gpu_env.sh "$A/setup.log"
tar_on_exit "$A"

gpu_tests 60 "$A/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
moe_sanitizers "$A" 45
timeout 60 python3 profiling/bench_moe_gemm.py --variants auto --tokens 8,32,64 --extra-tokens 32,64 \
  --reps 10 --out "$A/moe_gemm_h200_wg_local.json" > "$A/bench.log" 2>&1
echo "bench exit $? (${SECONDS}s)"; grep -E "^qwen3\S+ +[0-9]|extra tiles" "$A/bench.log" \
  | grep -oE "^qwen3\S+ +(T= +)?[0-9]+|v1_tn8_st(2|4)_mb2_wg0_qa1_pf1_ov0_cps(2|4)(_wl1)? [0-9.]+| +[0-9.]+ +[0-9]+ +[0-9.]+ +[0-9-]+$" | tr '\n' ' '; echo
limit=$(( $(left) - 3 ))
[ "$limit" -gt 30 ] && gpu_tests "$limit" "$A/engine_gpu_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_engine.py -m gpu
