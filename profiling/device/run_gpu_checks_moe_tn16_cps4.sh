#!/usr/bin/env bash
# Issue 4, one H200 call (< 6 min): two off-table v1 tilings against auto, same run: TN=16 for 8-16 routed
# rows per expert (T = 128-256) and the TN=8 ring as 2 stages of 4 K chunks (one CTA barrier per 256 K)
#   (1) every MoE GPU test (all tilings bitwise, the new ones among them); memcheck and racecheck on tiny
#   (2) bench_moe_gemm auto with the off-table tiles (EXTRA_TILES) at T = 64, 128, 256, twice
# Usage (repo root, carry .whl and a JIT cache): OUT=$OUT bash profiling/device/run_gpu_checks_moe_tn16_cps4.sh
set -uo pipefail
OUT=${OUT:-runs/moe_tn16_cps4}
BUDGET=${BUDGET:-330}
A="$OUT/mtc"
mkdir -p "$A"
source profiling/device/gpu_env.sh "$A/setup.log"
tar_on_exit "$A"

gpu_tests 100 "$A/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
moe_sanitizers "$A" 70
for round in 1 2; do
  [ "$(left)" -lt 50 ] && break
  timeout $(( $(left) - 5 )) python3 profiling/bench_moe_gemm.py --variants auto --tokens 64,128,256 \
    --extra-tokens 64,128,256 --reps 10 --out "$A/moe_gemm_h200_tn16_cps4_run$round.json" > "$A/bench$round.log" 2>&1
  echo "bench $round exit $? (${SECONDS}s)"; grep -E "^qwen3\S+ +[0-9]|extra tiles" "$A/bench$round.log" \
    | sed -E 's/ws_[a-z0-9_]+ [0-9.]+,? ?//g; s/v1_tn8_st8_mb2_wg0_pf[01]_ov[01] [0-9.]+,? ?//g'
done
