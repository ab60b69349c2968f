#!/usr/bin/env bash
# What limits the MoE prefill GEMMs on the H200, in one call (BUDGET s):
#   1. Nsight Compute (one launch each, clocks not locked) on Qwen3-30B-A3B at T=16384 with the tiles production
#      calls pick per GEMM kind (moe_gemm_ncu_case.py --auto-tiles): the fused gate_up's GEMM (v1 TN=128, h only;
#      the quantize kernel follows it) and the down GEMM (ws, two 64-row weight tiles per consumer warpgroup, when
#      this ran first; v1's TN=128 ring since the thirty-sixth session); NCU_SOURCE=1 adds the warp stalls per SASS
#      instruction (gpu_env.sh's ncu_report, profiling/ncu_source_stalls.py)
#   2. (its first call only) compute-sanitizer racecheck on test_torch_ops_give_the_eager_bits_and_compile[8]: it did not
#      finish its first test in 300 s (torch.compile under racecheck); run_gpu_checks_down_prefill_ab.sh racechecks the
#      eager tests that launch the same kernels
# Usage (repo root; carry .whl, .tkcache_moe): OUT=$OUT [BUDGET=560] [NCU_SOURCE=1] bash profiling/device/run_gpu_checks_prefill_ncu.sh
#   -> $OUT/prefill_ncu.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call prefill_ncu 560

moe_build 120 "$DIR/build.log" tiny qwen3-30b-a3b
CASE=(python3 profiling/moe_gemm_ncu_case.py --shape qwen3-30b-a3b --tokens 16384 --repeat 1 --auto-tiles)
ncu_report "$DIR/ncu_gate_up_t16384" 75 "gate_up_swiglu_h" "${CASE[@]}"
ncu_report "$DIR/ncu_down_t16384" 75 "down_routed" "${CASE[@]}"
echo "== done ($(left)s left)"
