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
# Usage (repo root, carry .whl, .tkcache and .ab_base): OUT=$OUT bash profiling/run_gpu_checks_moe_unrolled.sh
set -uo pipefail
OUT=${OUT:-runs/moe_unrolled}
BUDGET=${BUDGET:-560}
BASE=${BASE:-.ab_base}
A="$OUT/mur"
mkdir -p "$A"
source profiling/gpu_env.sh "$A/setup.log"
tar_on_exit "$A"

gpu_tests 120 "$A/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
gpu_tests 100 "$A/engine_gpu_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_engine.py -m gpu
for tool in memcheck racecheck; do
  sanitize $tool 70 "$A/sanitizer_$tool.log" python3 -m pytest -q -p no:cacheprovider tests/gpu/test_moe_gemm.py \
    -k "(test_gate_up_fused_quantization_is_exact or test_down_combine) and tiny and 64"
done

for round in 1 2; do
  TOKENS=1,8,32,64,128,256,1024
  [ "$round" = 1 ] && TOKENS=$TOKENS,4096,16384
  for tree in new base; do
    [ "$(left)" -lt 70 ] && break 2
    if [ "$tree" = new ]; then
      timeout 120 python3 profiling/bench_moe_gemm.py --variants auto --tokens $TOKENS --reps 10 \
        --out "$A/moe_gemm_h200_unrolled_${tree}${round}.json" > "$A/bench_${tree}${round}.log" 2>&1
    else
      PYTHONPATH=/tmp/site:$PWD/$BASE/python:$PWD/rl timeout 120 python3 "$BASE/profiling/bench_moe_gemm.py" \
        --variants auto --tokens $TOKENS --reps 10 \
        --out "$A/moe_gemm_h200_unrolled_${tree}${round}.json" > "$A/bench_${tree}${round}.log" 2>&1
    fi
    echo "bench $tree $round exit $? (${SECONDS}s)"
    grep -E "^qwen3\S+ +[0-9]" "$A/bench_${tree}${round}.log" | awk '{print $1, $2, $5, $8}' | tr '\n' ';'; echo
  done
done
if [ "$(left)" -gt 60 ]; then
  limit=$(( $(left) - 10 ))
  timeout "$limit" python3 profiling/bench_moe_gemm.py --variants auto --tokens 8,64,128 --extra-tokens 8,64,128 \
    --reps 10 --out "$A/moe_gemm_h200_unrolled_extra.json" > "$A/bench_extra.log" 2>&1
  echo "bench extra exit $? (${SECONDS}s)"; grep -E "extra tiles" "$A/bench_extra.log"
fi
