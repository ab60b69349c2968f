#!/usr/bin/env bash
# Where the prefill GEMMs wait now that auto's prefill ring pipelines its k16 steps (step_pipeline, thirty-eighth
# session), against the thirty-seventh session's profile of the same GEMMs without it
# (profiling/results/prefill_ncu_h200_checks.log: the wgmma wait, WARPGROUP.DEPBAR, 30% / 24% of the samples), in one
# call (BUDGET s):
#   1. Nsight Compute with the warp stalls per SASS instruction (ncu_report, NCU_SOURCE=1) on Qwen3-30B-A3B at T=16384,
#      the tiles production calls pick (moe_gemm_ncu_case.py --auto-tiles): the fused gate_up's GEMM and the down GEMM
#   2. while time is left: one more round of the layer, auto against auto_sp0, on issue 4's token list (the card's
#      figures for the new auto; run_gpu_checks_step_pipeline_default.sh ran two on an H100)
# Usage (repo root; carry .whl, .tkcache_moe): OUT=$OUT [BUDGET=400] bash profiling/device/run_gpu_checks_step_pipeline_ncu.sh
#   .tkcache_moe: python profiling/prebuild_device_caches.py --cache .tkcache_moe moe_tests
#   -> $OUT/step_pipeline_ncu.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call step_pipeline_ncu 400

moe_build_ab "$DIR" auto,auto_sp0
export NCU_SOURCE=1
CASE=(python3 profiling/moe_gemm_ncu_case.py --shape qwen3-30b-a3b --tokens 16384 --repeat 1 --auto-tiles)
[ "$(left)" -gt 80 ] && ncu_report "$DIR/ncu_gate_up_t16384" 75 "gate_up_swiglu_h" "${CASE[@]}"
[ "$(left)" -gt 80 ] && ncu_report "$DIR/ncu_down_t16384" 75 "down_routed" "${CASE[@]}"
[ "$(left)" -gt 100 ] && layer_ab_round "$DIR" 3 $(( $(left) - 10 )) --variants auto,auto_sp0 \
  --tokens 1,8,32,64,128,256,1024,4096,16384
echo "== done ($(left)s left)"
