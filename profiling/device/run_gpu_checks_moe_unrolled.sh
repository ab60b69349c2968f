#!/usr/bin/env bash
# Issue 4, one H200 call (< 8 min): v1's main loop unrolled by the ring's slots (compile-time stage
# offsets and wgmma descriptors, one global base per turn of the ring: ~136 -> ~107 SASS per chunk
# and thread on the TN=8 decode tile) and v1 ring stages of two K chunks (chunks_per_stage=2: one wait
# and CTA barrier per 128 K; EXTRA_TILES).
#   (1) every MoE GPU test (all tilings bitwise, the new ones among them); the engine's GPU tests
#   (2) compute-sanitizer memcheck and racecheck on the tiny fused gate_up and down tests (every tiling)
#   (3) same-run A/B of the layer: this tree against BASE (.ab_base, see run_gpu_checks_moe_decode_gather.sh),
#       twice each in turn, auto table, T = 1 .. 16384 (prefill in the first round), both presets; then
#       this tree's off-table tiles (EXTRA_TILES) at T = 8, 64, 128
# Usage (repo root, carry .whl, .tkcache and .ab_base): OUT=$OUT bash profiling/device/run_gpu_checks_moe_unrolled.sh
set -uo pipefail
OUT=${OUT:-runs/moe_unrolled}
BUDGET=${BUDGET:-560}
BASE=${BASE:-.ab_base}
A="$OUT/mur"
mkdir -p "$A"
source profiling/device/gpu_env.sh "$A/setup.log"
tar_on_exit "$A"

gpu_tests 120 "$A/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
gpu_tests 100 "$A/engine_gpu_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_engine.py -m gpu
moe_sanitizers "$A" 70

for round in 1 2; do
  TOKENS=1,8,32,64,128,256,1024
  [ "$round" = 1 ] && TOKENS=$TOKENS,4096,16384
  for tree in new base; do
    [ "$(left)" -lt 70 ] && break 2
    bench_moe_tree "$tree" "$A" moe_gemm_h200_unrolled "$round" "$TOKENS" 120 "$BASE"
  done
done
if [ "$(left)" -gt 60 ]; then
  limit=$(( $(left) - 10 ))
  timeout "$limit" python3 profiling/bench_moe_gemm.py --variants auto --tokens 8,64,128 --extra-tokens 8,64,128 \
    --reps 10 --out "$A/moe_gemm_h200_unrolled_extra.json" > "$A/bench_extra.log" 2>&1
  echo "bench extra exit $? (${SECONDS}s)"; grep -E "extra tiles" "$A/bench_extra.log"
fi
