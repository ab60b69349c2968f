#!/usr/bin/env bash
# Issue 4: programmatic dependent launches (PDL) between the MoE layer's kernels. Builds the MoE kernels
# of three presets, runs the PDL GPU tests (pdl=True bitwise equal to plain launches, eager and from a
# CUDA graph whose first nodes poison the intermediate buffers), times the layer with and without PDL in
# the same run (auto vs auto:nopdl), then every MoE GPU test, the rollout engine's GPU tests (its MoE
# GEMMs launch with pdl=True) and memcheck on a PDL test case.
# Usage (repo root; carry .whl and .tkcache_moe): TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_moe OUT=$OUT \
#   bash profiling/device/run_gpu_checks_moe_pdl.sh      -> $OUT/moe_pdl.tar
set -uo pipefail
OUT=${OUT:-runs/moe_pdl}
BUDGET=${BUDGET:-570}
DIR="$OUT/moe_pdl"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv >> "$DIR/setup.log" 2>&1
timeout 170 python3 profiling/moe_prebuild.py --jobs 16 tiny qwen3-30b-a3b qwen3-235b-a22b > "$DIR/build.log" 2>&1
echo "build exit $? (${SECONDS}s)"; tail -1 "$DIR/build.log"
gpu_tests 100 "$DIR/pdl_tests.log" tests/gpu/test_moe_gemm.py -k "programmatic or cuda_graph_replay"
timeout 130 python3 profiling/bench_moe_gemm.py --variants auto,auto:nopdl --tokens 1,8,32,64,256 --reps 10 \
  --out "$DIR/moe_gemm_h200_pdl.json" > "$DIR/bench.log" 2>&1
echo "bench exit $? (${SECONDS}s)"; grep -E "^qwen3|^shape" "$DIR/bench.log" | tail -12
limit=$(( $(left) - 75 )); [ "$limit" -gt 130 ] && limit=130
[ "$limit" -gt 20 ] && gpu_tests "$limit" "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py -k "not programmatic"
limit=$(( $(left) - 25 )); [ "$limit" -gt 60 ] && limit=60
[ "$limit" -gt 20 ] && gpu_tests "$limit" "$DIR/engine_gpu_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_engine.py -m gpu
limit=$(( $(left) - 3 ))
[ "$limit" -gt 15 ] && sanitize memcheck "$limit" "$DIR/sanitizer_memcheck.log" python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_moe_gemm.py -k "programmatic and 8 and v1"
