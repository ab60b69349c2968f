#!/usr/bin/env bash
# Where the T=1 decode GEMMs spend their time (thirty-ninth session): Qwen3-30B-A3B at T=1 runs at 18% of its roofline
# on the H200 (the layer 27 us for 26.5 MB); its GEMMs are auto's ws tiles (the gate_up with one consumer warpgroup at
# 3 CTAs/SM, the down GEMM with two at 2). Nsight Compute with the warp stalls per SASS instruction (ncu_report,
# NCU_SOURCE=1) on the fused gate_up, the plain gate_up (its epilogue's share) and the down GEMM, each one launch:
# kernel duration against the graph-timed op (launch overhead), DRAM throughput, and where the warps wait.
# Usage (repo root; carry .whl, .tkcache_moe): OUT=$OUT [BUDGET=300] bash profiling/device/run_gpu_checks_moe_t1_ncu.sh
#   -> $OUT/moe_t1_ncu.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_t1_ncu 300

moe_build_ab "$DIR" auto
export NCU_SOURCE=1
CASE=(python3 profiling/moe_gemm_ncu_case.py --shape qwen3-30b-a3b --tokens 1 --repeat 1 --auto-tiles --plain)
[ "$(left)" -gt 70 ] && ncu_report "$DIR/ncu_gate_up_fused_t1" 60 "gate_up_swiglu_nvfp4.*_ws1_" "${CASE[@]}"
[ "$(left)" -gt 70 ] && ncu_report "$DIR/ncu_gate_up_plain_t1" 60 "moe_gemm_gate_up_nvfp4.*_ws1_" "${CASE[@]}"
[ "$(left)" -gt 70 ] && ncu_report "$DIR/ncu_down_t1" 60 "down_routed.*_ws1_" "${CASE[@]}"
echo "== done ($(left)s left)"
