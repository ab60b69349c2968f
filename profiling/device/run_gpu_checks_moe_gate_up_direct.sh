#!/usr/bin/env bash
# Issue 4: the checks `auto_gd` needs before it can be `auto` (sixty-third session). auto_gd is auto with a gate_up GEMM
# of K <= 2048 (30B's) on the down GEMM's direct tile from above 1/8 to 1 routed row per expert (T = 3 to 16 at top-8 of
# 128 experts); on an H100 its 30B layer took 6.3-8.0% less at T=4 and 2.2-2.9% less at T=16 (docs/moe_gemm.md,
# "2026-12-07 (sixty-third session)"). In one call, the checks first (machines came rarely in the sixty-fourth
# session, so a call may get less time than asked):
#   1. the carried cache checked (the A/B tables of 30B and 235B; builds what is missing);
#   2. with TRACE_KERNELS_MOE_VARIANT=auto_gd, so that every call without tile= runs the candidate: the MoE GPU tests,
#      the RL layer's GPU tests (the rollout engine's MoE layers on it), then memcheck and racecheck on the odd-chunks
#      shape at T=1, top-2 (2/8 routed row per expert: auto_gd's gate_up on the direct tile, at a K of 4.5 chunks);
#   3. the layer, auto against auto_gd at T = 2, 4, 8, 16, 32 (T=2 and 32: the same kernels, controls), two rounds with
#      the arms' order reversed in the second;
#   4. the ws band (Next steps 10): auto against auto_v1lo and auto_v1cb at T = 1, 2, 4, two rounds (on an H100, v1's
#      tiles lost T=1 and won 235B T=2);
#   5. while time is left: Nsight Compute on the candidate's fused gate_up at 30B T=4 (its Occupancy section: does the
#      driver's carveout give it the 6 CTAs/SM its shared memory allows?), the sanitizers on the tiny layer over every
#      tiling, and step 3's two rounds again.
# Usage (repo root; carry .whl and .tkcache_gd: TRACE_KERNELS_MOE_VARIANT=auto_gd python
#   profiling/prebuild_device_caches.py --cache .tkcache_gd moe_tests engine, then into it
#   TRACE_KERNELS_CACHE_DIR=.tkcache_gd python profiling/moe_prebuild.py --tables auto_v1lo,auto_v1cb --no-extras
#   qwen3-235b-a22b):
#   OUT=$OUT [BUDGET=540] bash profiling/device/run_gpu_checks_moe_gate_up_direct.sh   -> $OUT/moe_gate_up_direct.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_gate_up_direct 540 .tkcache_gd
head -2 "$DIR/machine.log"
moe_build 90 "$DIR/build.log" --tables auto,auto_gd,auto_v1lo,auto_v1cb --no-extras qwen3-30b-a3b qwen3-235b-a22b
mkdir -p "$DIR/ab" "$DIR/band" "$DIR/ab2"
# capped MAX: at most MAX s and 10 s short of BUDGET's end, at least 1 (timeout 0 would not limit)
capped() { local n=$(( $(left) - 10 )); n=$(( n < $1 ? n : $1 )); echo $(( n > 1 ? n : 1 )); }
export TRACE_KERNELS_MOE_VARIANT=auto_gd  # the tests' and the engine's default table
gpu_tests "$(capped 100)" "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
gpu_tests "$(capped 90)" "$DIR/rl_gpu_tests.log" -m gpu tests/rl
for tool in memcheck racecheck; do
  limit=$(capped 50)
  [ "$limit" -gt 10 ] && sanitize "$tool" "$limit" "$DIR/sanitizer_gd_$tool.log" \
    python3 -m pytest -q -p no:cacheprovider tests/gpu/test_moe_gemm.py -k "odd_chunk_counts and 1-2"
done
unset TRACE_KERNELS_MOE_VARIANT
layer_ab_swapped "$DIR/ab" 60 40 auto,auto_gd --tokens 2,4,8,16,32
layer_ab_swapped "$DIR/band" 45 35 auto,auto_v1lo,auto_v1cb --tokens 1,2,4
export TRACE_KERNELS_MOE_VARIANT=auto_gd
[ "$(left)" -gt 80 ] && ncu_report "$DIR/ncu_gate_up_direct_t4" 60 "moe_gemm_gate_up_swiglu_h_.*_wd3_" \
  python3 profiling/moe_gemm_ncu_case.py --shape qwen3-30b-a3b --tokens 4 --repeat 1 --auto-tiles
moe_sanitizers_left "$DIR" 50
unset TRACE_KERNELS_MOE_VARIANT
layer_ab_swapped "$DIR/ab2" 60 40 auto,auto_gd --tokens 2,4,8,16,32
echo "== done ($(left)s left)"
