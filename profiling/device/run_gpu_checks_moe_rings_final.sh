#!/usr/bin/env bash
# Issue 4, one H200 call (eleventh session of 2026-12-02): the committed table (TN=16 / TN=32 as 2 stages of
# 4 chunks, the down GEMM's TN=32 as 3 of 2, the prefill tile as 2 stages of 2) against the previous commit
# (.ab_base = 47586f6): run_gpu_checks_moe_table_ab.sh at T = 1 to 16384.
# Usage (repo root; carry .whl, .tkcache and .ab_base):
#   OUT=$OUT bash profiling/device/run_gpu_checks_moe_rings_final.sh -> $OUT/moe_gemm_h200_rings_final.tar
NAME=moe_gemm_h200_rings_final TOKENS=${TOKENS:-1,8,32,64,128,256,512,1024,4096,16384} exec bash profiling/device/run_gpu_checks_moe_table_ab.sh
