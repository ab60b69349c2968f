#!/usr/bin/env bash
# Issue 4, one H200 call (< 8 min): v1's per-thread copy addresses computed once per CTA instead of per
# K chunk (moe_gemm.cuh load_stage; the decode tiles' main loop issues ~18% fewer instructions)
#   (1) every MoE GPU test (all tilings bitwise against each other, batch invariance, graphs, bad input)
#   (2) compute-sanitizer memcheck and racecheck on the tiny fused gate_up tests (every tiling)
#   (3) same-run A/B of the layer: this tree against BASE (a copy of the previous commit's python/,
#       cuda/, codegen/ and bench script, carried as .ab_base), twice each in turn, auto table,
#       T = 1 .. 1024, both presets
# The base copy (ignored by git, so the device tool takes it only as a carried path):
#   rm -rf .ab_base && mkdir .ab_base && git archive BASE_COMMIT python cuda codegen \
#     profiling/bench_moe_gemm.py profiling/device/gpu_env.sh | tar -x -C .ab_base
# and both trees' kernels in the carried JIT cache (kernels are keyed on their headers, so they coexist;
# 2026-12-02 used a cache of only the MoE and quantize kernels, TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_moe,
# to stay under the 64 MiB carry limit).
# Usage (repo root, carry .whl, .tkcache and .ab_base): OUT=$OUT bash profiling/device/run_gpu_checks_moe_decode_gather.sh
set -uo pipefail
OUT=${OUT:-runs/moe_decode_gather}
BUDGET=${BUDGET:-500}
BASE=${BASE:-.ab_base}
A="$OUT/mdg"
mkdir -p "$A"
source profiling/device/gpu_env.sh "$A/setup.log"
tar_on_exit "$A"

gpu_tests 120 "$A/gpu_tests.log" tests/gpu/test_moe_gemm.py
for tool in memcheck racecheck; do
  sanitize $tool 70 "$A/sanitizer_$tool.log" python3 -m pytest -q -p no:cacheprovider tests/gpu/test_moe_gemm.py \
    -k "test_gate_up_fused_quantization_is_exact and tiny and 64"
done

TOKENS=1,8,32,64,128,256,1024
for round in 1 2; do
  for tree in new base; do
    [ "$(left)" -lt 40 ] && break 2
    bench_moe_tree "$tree" "$A" moe_gemm_h200_decode_gather "$round" "$TOKENS" 90 "$BASE"
  done
done
