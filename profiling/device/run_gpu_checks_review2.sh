#!/usr/bin/env bash
# A record: it names memory-kernel variants removed on 2026-12-05 (refit_weights v1, v3-v7, v10, v11; quantize v1,
# v4; guided_fake_quantize v1-v6 as variants), so it runs as written only on commit 32f5e89 or earlier.
# The review commit 87d4a95 on the H200 (v1 and ws MoE GEMMs share load_token_rows; guided v5 / v6 size
# their grid by _common.resident_ctas): every MoE GPU test (v1, ws, auto, PDL chains), every guided
# GPU test, memcheck on the tiny MoE layer and on the guided v6 persistent-pass tests, racecheck on the
# tiny layer.
# Usage (repo root; carry .whl): OUT=$OUT bash profiling/device/run_gpu_checks_review2.sh  -> $OUT/review2.tar
set -uo pipefail
OUT=${OUT:-runs/review2}
BUDGET=${BUDGET:-560}
DIR="$OUT/review2"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 150 python3 profiling/moe_prebuild.py --jobs 16 tiny qwen3-30b-a3b > "$DIR/build.log" 2>&1
echo "moe build exit $? (${SECONDS}s)"; tail -1 "$DIR/build.log"
timeout 150 python3 profiling/prebuild_memory_kernels.py --jobs 16 nvfp4_guided > "$DIR/build_memory.log" 2>&1
echo "memory build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_memory.log"
gpu_tests 100 "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
gpu_tests 120 "$DIR/guided_gpu_tests.log" tests/gpu/test_quantize_kernels.py -k guided
limit=$(( ($(left) - 50) / 3 )); [ "$limit" -gt 60 ] && limit=60
[ "$limit" -gt 15 ] && moe_sanitizers "$DIR" "$limit"
limit=$(( $(left) - 5 )); [ "$limit" -gt 60 ] && limit=60
[ "$limit" -gt 15 ] && sanitize memcheck "$limit" "$DIR/sanitizer_memcheck_guided.log" python3 -m pytest -q \
  -p no:cacheprovider tests/gpu/test_quantize_kernels.py -k "test_guided_persistent_passes and (v5 or v6)"
