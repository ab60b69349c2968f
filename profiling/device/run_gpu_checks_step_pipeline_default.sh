#!/usr/bin/env bash
# step_pipeline on auto's prefill ring (thirty-eighth session, after run_gpu_checks_step_pipeline_ab.sh's layer A/B on
# an H100; "auto_sp0" is auto without it), checked in one call (BUDGET s):
#   1. the layer on the whole of issue 4's token list, auto against auto_sp0, two rounds in one process each, arms
#      swapped in the second (below T=4096 both arms run the same kernels: the control); the table of "Where it
#      stands" in docs/moe_gemm.md
#   2. the MoE GPU tests (auto's prefill ring now pipelines its steps) and the RL layer's GPU tests (the engine's
#      prefill runs it), then memcheck and racecheck on the tiny layer over every tiling (owed for auto's row_amax ws
#      tile since the forty-third session: its racecheck ran every kernel with no hazard but hit its 50 s limit before
#      the summary)
#   3. while time is left: Nsight Compute with the warp stalls per SASS instruction (ncu_report, NCU_SOURCE=1) on the
#      decode GEMMs auto runs at T=64 (the fused gate_up's v1 TN=8 ring; the down GEMM's weights_direct tile on 30B,
#      TN=8 ring on 235B), Qwen3-30B-A3B first, then Qwen3-235B-A22B (whose layer is nearer its roofline: 87% against
#      70% on the H200): is their "barrier" stall the wgmma wait, as the prefill tiles' was? (It is not: the first
#      call, on an H100, found the weights' arrival and the CTA barrier.)
# (memcheck and racecheck on the tiny layer over every tiling, the step_pipeline extra tiles among them, ran clean in
# run_gpu_checks_step_pipeline_ab.sh's call: profiling/results/step_pipeline_ab_h100_checks.log)
# Usage (repo root; carry .whl, .tkcache_moe; REQUIRE_GPU=H200: exit at once on another card, gpu_env.sh):
#   REQUIRE_GPU=H200 OUT=$OUT [BUDGET=560] bash profiling/device/run_gpu_checks_step_pipeline_default.sh
#   (LAYER_MIN_LEFT=S: start a layer round while more than S s are left, default 330; a smaller BUDGET's one round)
#   (CHECKS=0: skip step 2, which passed on an H100 with the same kernels, for a short budget: e.g.
#    CHECKS=0 BUDGET=300 LAYER_MIN_LEFT=200, the build, two layer rounds and the profiles)
#   .tkcache_moe: python profiling/prebuild_device_caches.py --cache .tkcache_moe moe_tests engine
#   -> $OUT/step_pipeline_default.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call step_pipeline_default 560

moe_build_ab "$DIR" auto,auto_sp0
[ "${CHECKS:-1}" = 1 ] && { prebuild_engine_test_models 60 "$DIR/build_engine.log"; echo "build_engine exit $? (${SECONDS}s)"; }
layer_ab_swapped "$DIR" 150 "${LAYER_MIN_LEFT:-330}" auto,auto_sp0 --tokens 1,8,32,64,128,256,1024,4096,16384
if [ "${CHECKS:-1}" = 1 ]; then
  limit=$(( $(left) - 110 )); [ "$limit" -gt 150 ] && limit=150
  [ "$limit" -gt 30 ] && gpu_tests "$limit" "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
  limit=$(( $(left) - 140 )); [ "$limit" -gt 100 ] && limit=100
  [ "$limit" -gt 30 ] && gpu_tests "$limit" "$DIR/rl_gpu_tests.log" -m gpu tests/rl
  moe_sanitizers_left "$DIR" 70
fi
export NCU_SOURCE=1
for shape in qwen3-30b-a3b qwen3-235b-a22b; do
  CASE=(python3 profiling/moe_gemm_ncu_case.py --shape "$shape" --tokens 64 --repeat 1 --auto-tiles)
  suffix=$([ "$shape" = qwen3-30b-a3b ] && echo "" || echo "_235b")  # (the first call's reports had no suffix)
  [ "$(left)" -gt 70 ] && ncu_report "$DIR/ncu_gate_up_t64$suffix" 60 "gate_up_swiglu_h" "${CASE[@]}"
  [ "$(left)" -gt 70 ] && ncu_report "$DIR/ncu_down_t64$suffix" 60 "down_routed" "${CASE[@]}"
done
echo "== done ($(left)s left)"
