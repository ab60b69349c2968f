#!/usr/bin/env bash
# Issue 4, one H200 call (< 4 min): around the TN=16 / TN=32 table boundary (12 routed rows per expert):
# both table tiles and an off-table TN=24 at T = 128, 192, 256 (8, 12, 16 rows per expert); the MoE GPU tests
# (TN=24 among the tilings); then bench_rollout --quick once more (its run-to-run spread).
# The TN=24 tile (TileConfig(24, 4, 2, 0, chunks_per_stage=2, fused_min_blocks=4, quantize_after=True)) was
# in EXTRA_TILES for this run only: it was slower than TN=16 and TN=32 everywhere and is gone; add it back to
# repeat the run.
# Usage (repo root, carry .whl and a JIT cache): OUT=$OUT bash profiling/device/run_gpu_checks_moe_tn24.sh
set -uo pipefail
OUT=${OUT:-runs/moe_tn24}
BUDGET=${BUDGET:-230}
A="$OUT/mt24"
mkdir -p "$A"
source profiling/device/gpu_env.sh "$A/setup.log"
tar_on_exit "$A"

gpu_tests 60 "$A/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
timeout 70 python3 profiling/bench_moe_gemm.py --variants auto --tokens 128,192,256 --extra-tokens 128,192,256 \
  --reps 10 --out "$A/moe_gemm_h200_tn24.json" > "$A/bench.log" 2>&1
echo "bench exit $? (${SECONDS}s)"; grep -E "^qwen3\S+ +[0-9]|extra tiles" "$A/bench.log" \
  | grep -oE "^qwen3\S+ +(T= +)?[0-9]+|v1_tn(16|24|32)_st[0-9]_mb2_wg0_qa1_pf1_ov0(_cps2)? [0-9.]+| +[0-9.]+ +[0-9]+ +[0-9.]+ +[0-9-]+$" | tr '\n' ' '; echo
limit=$(( $(left) - 5 ))
timeout "$limit" python3 profiling/bench_rollout.py --quick --out "$A/rollout_h200_quick_tn24.json" > "$A/rollout.log" 2>&1
echo "rollout exit $? (${SECONDS}s)"; grep -E "graphs \[kernels, kv-kernels\]|reference, kv-kernels\] batch.*graphs|nvfp4 / bf16" "$A/rollout.log"
