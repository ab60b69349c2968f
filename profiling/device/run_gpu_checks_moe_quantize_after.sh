#!/usr/bin/env bash
# Issue 4, one H200 call (<= BUDGET s): the fused gate_up with its rows quantized by the quantize
# kernel after a GEMM that stores SwiGLU's h only (TileConfig.quantize_after; table "auto_qa")
#   (1) MoE GPU tests over every tiling, the quantize_after tiles among them: fused outputs exactly
#       nvfp4.quantize of the kernel's own h (also extreme rows), batch invariance (bitwise across every
#       tiling), CUDA-graph replay, ws few-CTA equality, the non-finite status word
#   (2) compute-sanitizer memcheck and racecheck on the tiny fused gate_up tests (every tiling)
#   (3) the layer benchmark, auto against auto_qa, same routing, both presets, T = 1 .. 16384
# Usage (repo root, carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_moe_quantize_after.sh
set -uo pipefail
OUT=${OUT:-runs/moe_quantize_after}
BUDGET=${BUDGET:-560}
A="$OUT/mqa"
mkdir -p "$A"
source profiling/device/gpu_env.sh "$A/setup.log"
tar_on_exit "$A"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv >> "$A/setup.log" 2>&1

gpu_tests 200 "$A/gpu_tests.log" tests/gpu/test_moe_gemm.py \
  -k "gate_up_fused or batch_invariance or cuda_graph or few_persistent or nonfinite"
sanitize memcheck 70 "$A/sanitizer_memcheck.log" python3 -m pytest -q -p no:cacheprovider tests/gpu/test_moe_gemm.py \
  -k "test_gate_up_fused_quantization_is_exact and tiny and 64"
sanitize racecheck 70 "$A/sanitizer_racecheck.log" python3 -m pytest -q -p no:cacheprovider tests/gpu/test_moe_gemm.py \
  -k "test_gate_up_fused_quantization_is_exact and tiny and 64"

limit=$(( $(left) - 10 ))
timeout "$limit" python3 profiling/bench_moe_gemm.py --variants auto,auto_qa --reps 10 \
  --out "$A/moe_gemm_h200_quantize_after.json" > "$A/bench.log" 2>&1
echo "bench exit: $? (limit ${limit}s, ${SECONDS}s)" | tee -a "$A/bench.log"; grep -vE '^\{' "$A/bench.log" | tail -24
