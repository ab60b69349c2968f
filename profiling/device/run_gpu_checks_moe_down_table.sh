#!/usr/bin/env bash
# Issue 4, one H200 call (<= BUDGET s): the auto table's own down-GEMM prefill tile (ws, two m-tiles)
#   (1) MoE GPU tests that run it: the down GEMM + combine against the reference for every tiling and
#       the default (tiny and qwen3-30b-a3b, T up to 1024), batch invariance (every tiling bitwise), graph replay
#   (2) compute-sanitizer memcheck and racecheck on the tiny down GEMM at T = 1024 (ws two m-tiles among them)
#   (3) the layer benchmark, auto (per-kind tables) against v1, same routing, both presets
# Usage (repo root, carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_moe_down_table.sh
set -uo pipefail
OUT=${OUT:-runs/moe_down_table}
BUDGET=${BUDGET:-420}
A="$OUT/md"
mkdir -p "$A"
source profiling/device/gpu_env.sh "$A/setup.log"
tar_on_exit "$A"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv >> "$A/setup.log" 2>&1

gpu_tests 150 "$A/gpu_tests.log" tests/gpu/test_moe_gemm.py -k "down_combine or batch_invariance or cuda_graph"
for tool in memcheck racecheck; do
  sanitize $tool 60 "$A/sanitizer_$tool.log" python3 -m pytest -q -p no:cacheprovider tests/gpu/test_moe_gemm.py \
    -k "test_down_combine_matches_reference and tiny-1024"
done

limit=$(( $(left) - 10 ))
timeout "$limit" python3 profiling/bench_moe_gemm.py --variants auto,v1 --tokens 64,1024,4096,16384 --reps 10 \
  --out "$A/moe_gemm_h200_down_table.json" > "$A/bench.log" 2>&1
echo "bench exit: $? (limit ${limit}s, ${SECONDS}s)" | tee -a "$A/bench.log"; grep -vE '^\{' "$A/bench.log" | tail -30
