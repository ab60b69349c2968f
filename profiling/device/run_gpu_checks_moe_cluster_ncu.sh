#!/usr/bin/env bash
# Why the cluster_quant fused gate_up lost its A/B (fifty-fourth session, an H100: 30B fused gate_up +10% to +35% over
# the plain GEMM against auto's +4% to +7%): Nsight Compute (clocks not locked, one launch each) on Qwen3-30B-A3B's
# fused gate_up at T=64 (TN=8 ring) and T=1024 (TN=32 ring), auto's kernel that stores h for the quantize launch after
# it (`gate_up_swiglu_h`) against auto_cq's cluster kernel (`_cq1`): duration, DRAM throughput, theoretical and
# achieved occupancy, the clusters the SMs hold at once (Occupancy and LaunchStats sections), and where the warps wait.
# Then, with the time left (at most 120 s), racecheck on the tiny cluster tiles at T=64, which did not finish inside the
# A/B call's 60 s.
# Usage (repo root; carry .whl, .tkcache_cq): OUT=$OUT [BUDGET=360] bash profiling/device/run_gpu_checks_moe_cluster_ncu.sh
#   -> $OUT/moe_cluster_ncu.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_cluster_ncu 360 .tkcache_cq

for t in 1024 64; do
  tn=$([ "$t" = 64 ] && echo 8 || echo 32)
  CASE=(python3 profiling/moe_gemm_ncu_case.py --shape qwen3-30b-a3b --tokens "$t" --repeat 1 --auto-tiles)
  [ "$(left)" -gt 50 ] && ncu_report "$DIR/ncu_auto_t$t" 45 "gate_up_swiglu_h_nvfp4.*_tn${tn}_" "${CASE[@]}"
  [ "$(left)" -gt 50 ] && TRACE_KERNELS_MOE_VARIANT=auto_cq \
    ncu_report "$DIR/ncu_auto_cq_t$t" 45 "gate_up_swiglu_nvfp4.*_tn${tn}_.*_cq1_" "${CASE[@]}"
  for rep in "$DIR/ncu_auto_t$t" "$DIR/ncu_auto_cq_t$t"; do
    [ -f "$rep.txt" ] && grep -E "Cluster|cluster" "$rep.txt" | head -8
  done
done
limit=$(( $(left) - 5 )); [ "$limit" -gt 120 ] && limit=120
[ "$limit" -gt 30 ] && sanitize racecheck "$limit" "$DIR/sanitizer_racecheck.log" python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_moe_gemm.py -k "test_cluster_quant_tiles_equal_quantize_after and tiny and 64"
echo "== done ($(left)s left)"
