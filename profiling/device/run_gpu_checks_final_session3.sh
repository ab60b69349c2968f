#!/usr/bin/env bash
# Closing H200 call of 2026-12-02's third session (< 6 min): the tree as committed
#   (1) profiling/device/run_gpu_checks_rollout.sh with BUDGET=330: the engine's GPU tests on the new MoE and
#       kv_append defaults, bench_rollout --quick, memcheck on a graphed engine test
#   (2) bench_moe_gemm at T = 1 and 8 with the off-table tilings (EXTRA_TILES: ws _ae1, quantize_after, ...)
# Usage (repo root, carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_final_session3.sh
set -uo pipefail
OUT=${OUT:-runs/final_session3}
A="$OUT/fs3"
mkdir -p "$A"
BUDGET=520
source profiling/device/gpu_env.sh "$A/setup.log"
tar_on_exit "$A"
OUT="$A/rollout" BUDGET=330 bash profiling/device/run_gpu_checks_rollout.sh 2>&1 | tail -22
limit=$(( $(left) - 10 ))
timeout "$limit" python3 profiling/bench_moe_gemm.py --variants auto --tokens 1,8 --extra-tokens 1,8 --reps 10 \
  --out "$A/moe_gemm_h200_decode_extra.json" > "$A/bench_extra.log" 2>&1
echo "bench exit: $? (limit ${limit}s, ${SECONDS}s)"; grep -vE '^\{' "$A/bench_extra.log" | tail -30
