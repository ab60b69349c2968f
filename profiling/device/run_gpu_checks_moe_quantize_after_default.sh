#!/usr/bin/env bash
# Issue 4, one H200 call (< 10 min): the auto table's fused gate_up with quantize_after on its v1 tiles
# (the default since 2026-12-02) end to end
#   (1) every MoE GPU test (tests/gpu/test_moe_gemm.py: all tilings, batch invariance, graphs, bad input)
#   (2) profiling/device/run_gpu_checks_rollout.sh with BUDGET=400: the engine's GPU tests (they call the MoE
#       GEMMs without a tile, so through auto), bench_rollout --quick, memcheck on a graphed engine test
# Usage (repo root, carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_moe_quantize_after_default.sh
set -uo pipefail
OUT=${OUT:-runs/moe_quantize_after_default}
A="$OUT/mqd"
mkdir -p "$A"
BUDGET=560
source profiling/device/gpu_env.sh "$A/setup.log"
tar_on_exit "$A"
gpu_tests 130 "$A/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
OUT="$A/rollout" BUDGET=400 bash profiling/device/run_gpu_checks_rollout.sh 2>&1 | tail -30
