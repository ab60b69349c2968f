#!/usr/bin/env bash
# Issue 4, one H200 call (eleventh session of 2026-12-02): the gate_up below 1/8 routed row per expert on the
# ws tile with one consumer warpgroup at 3 CTAs/SM (run_gpu_checks_moe_t1_tiles.sh's sweep), against the
# previous commit: run_gpu_checks_moe_table_ab.sh at T = 1, 2, 4, 8.
# Ran in the twelfth session with AUTO_GATE_UP_TABLE's first row WS_ONE_WARPGROUP_TILE against .ab_base = e4a1f8c
# (profiling/results/moe_gemm_h200_ws1wg.json, moe_ws1wg_h200_checks.log).
# Usage (repo root; carry .whl, .tkcache and .ab_base):
#   OUT=$OUT bash profiling/device/run_gpu_checks_moe_ws1wg.sh -> $OUT/moe_gemm_h200_ws1wg.tar
NAME=moe_gemm_h200_ws1wg TOKENS=${TOKENS:-1,2,4,8} exec bash profiling/device/run_gpu_checks_moe_table_ab.sh
