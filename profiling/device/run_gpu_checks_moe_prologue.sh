#!/usr/bin/env bash
# Issue 4, one H200 call (< 9 min): v1 requests its first chunks of weights before the activation rows
# are looked up (a moe_gemm.cuh prologue change, measured mixed and reverted: docs/moe_gemm.md; this
# script now runs the tree against BASE as it is); and the GPU paths that 10c47a2's refactors touched
# (refit / refit_packed launchers, kv_append_nvfp4, fused gate_up kinds).
#   (1) every MoE, refit-packed, quantize/refit and KV GPU test; the rollout engine's GPU tests
#   (2) compute-sanitizer memcheck and racecheck on the tiny fused gate_up tests and on the down GEMM
#   (3) same-run A/B of the layer: this tree against BASE (.ab_base, see run_gpu_checks_moe_decode_gather.sh),
#       twice each in turn, auto table, T = 1 .. 1024, both presets
#   (4) Nsight Compute on the 30B T=64 gate_up and down kernels of this tree
# Usage (repo root, carry .whl, .tkcache and .ab_base): OUT=$OUT bash profiling/device/run_gpu_checks_moe_prologue.sh
set -uo pipefail
OUT=${OUT:-runs/moe_prologue}
BUDGET=${BUDGET:-540}
BASE=${BASE:-.ab_base}
A="$OUT/mpl"
mkdir -p "$A"
source profiling/device/gpu_env.sh "$A/setup.log"
tar_on_exit "$A"

gpu_tests 100 "$A/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py tests/gpu/test_refit_packed.py
gpu_tests 100 "$A/memory_kv_gpu_tests.log" tests/gpu/test_quantize_kernels.py tests/gpu/test_kv_kernels.py -k "refit or append"
gpu_tests 120 "$A/engine_gpu_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_engine.py -m gpu
moe_sanitizers "$A" 60

TOKENS=1,8,32,64,128,256,1024
for round in 1 2; do
  for tree in new base; do
    [ "$(left)" -lt 60 ] && break 2
    bench_moe_tree "$tree" "$A" moe_gemm_h200_prologue "$round" "$TOKENS" 90 "$BASE"
  done
done

if [ "$(left)" -gt 50 ]; then
  ncu_report "$A/ncu_moe_v1_t64" 45 "moe_gemm_" python3 profiling/moe_gemm_ncu_case.py --shape qwen3-30b-a3b --tokens 64
fi
if [ "$(left)" -gt 40 ]; then
  ncu_report "$A/ncu_moe_v1_down_t64" 35 "moe_gemm_down" python3 profiling/moe_gemm_ncu_case.py --shape qwen3-30b-a3b --tokens 64
fi
