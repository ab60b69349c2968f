#!/usr/bin/env bash
# step_pipeline on the prefill ring (thirty-seventh session: 1.4-3.3% less time for both prefill GEMMs on 30B in four
# same-run sweep rounds on an H100, mixed on 235B, outputs bitwise equal to auto's ring) as the layer A/B that would
# make it auto's, on the H200, in one call (BUDGET s):
#   1. the layer, auto with step_pipeline on its prefill ring, both GEMMs ("auto_sp" then, auto since the thirty-eighth
#      session) against auto without it ("auto" then, "auto_sp0" since), two rounds in one process each, arms swapped
#      in the second, at T=1024 (control: the same kernels) / 2048 / 4096 / 16384
#   2. the MoE GPU tests (the step_pipeline extra tiles against the reference and bitwise against every other tiling)
#   3. memcheck and racecheck on the tiny layer over every tiling (moe_sanitizers)
# (gpu_env.sh's moe_layer_ab)
# Usage (repo root; carry .whl, .tkcache_moe): OUT=$OUT [BUDGET=560] bash profiling/device/run_gpu_checks_step_pipeline_ab.sh
#   .tkcache_moe: python profiling/prebuild_device_caches.py --cache .tkcache_moe moe_tests
#   -> $OUT/step_pipeline_ab.tar
# Ran on an H100 (thirty-eighth session, asked for either card): profiling/results/moe_step_pipeline_ab_h100_round{1,2}.json,
# step_pipeline_ab_h100_checks.log. auto took it; run_gpu_checks_step_pipeline_default.sh checks the new auto.
set -uo pipefail
source profiling/device/gpu_env.sh --call step_pipeline_ab 560

moe_layer_ab "$DIR" auto_sp0,auto 1024,2048,4096,16384 100
echo "== done ($(left)s left)"
