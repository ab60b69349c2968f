#!/usr/bin/env bash
# After moving the mbarrier / bulk-copy helpers of moe_gemm_ws.cuh into bulk_copy.cuh and the
# dynamic shared-memory attribute into CudaKernel.allow_dynamic_smem (2026-11-30): build the MoE
# kernels the GPU tests use (16 jobs) and run tests/gpu/test_moe_gemm.py (< 9 min).
# Outputs in $OUT/moe/, tarred to $OUT/moe.tar.
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_moe_refactor.sh
set -uo pipefail
W="$OUT/moe"; mkdir -p "$W"; trap 'tar -cf "$OUT/moe.tar" -C "$W" .' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
echo "== build"; timeout 300 python3 profiling/moe_prebuild.py --jobs 16 tiny qwen3-30b-a3b > "$W/build.log" 2>&1
echo "build exit $?"; tail -2 "$W/build.log"
echo "== tests"; timeout 220 python3 -m pytest tests/gpu/test_moe_gemm.py -q -rfE -p no:cacheprovider > "$W/tests.log" 2>&1
echo "tests exit $?"; grep -E "^FAILED" "$W/tests.log" | head; tail -1 "$W/tests.log"
