#!/usr/bin/env bash
# Issue 4, one H200 call (eleventh session of 2026-12-02): TN=32 up to 64 routed rows per expert (was 32),
# after run_gpu_checks_moe_tn64.sh's sweep, against the previous commit (.ab_base = 9ea30a0):
# run_gpu_checks_moe_table_ab.sh at T = 256 to 2048.
# Usage (repo root; carry .whl, .tkcache and .ab_base):
#   OUT=$OUT bash profiling/device/run_gpu_checks_moe_tn32_band.sh -> $OUT/moe_gemm_h200_tn32_band.tar
NAME=moe_gemm_h200_tn32_band TOKENS=${TOKENS:-256,512,768,1024,1536,2048} exec bash profiling/device/run_gpu_checks_moe_table_ab.sh
