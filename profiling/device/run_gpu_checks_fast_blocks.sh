#!/usr/bin/env bash
# A record: it names memory-kernel variants removed on 2026-12-05 (refit_weights v1, v3-v7, v10, v11; quantize v1,
# v4; guided_fake_quantize v1-v6 as variants), so it runs as written only on commit 32f5e89 or earlier.
# Issue 3 / 5: the branch-free block path (quantize_epilogue.cuh: row_scale_fast rows, Markstein
# block step, packed block amax, compile-time optional outputs) in quantize v2 / v4, refit and
# kv_append (which moves from per-element FP32 thresholds to the packed path), on the H200 (< 9 min):
#   1. build the memory and kv_append kernels (16 jobs; the MoE GEMM includes none of the changed headers)
#   2. GPU tests: test_quantize_kernels.py (all ops), the kv_append tests
#   3. bench_memory_kernels.py (quantize v2/v4 and v2 at 64/128/256 threads per block, guided v4,
#      refit v2/v3/v4; 64 MB .. 1 GB) and bench_attention.py --append-only, each with its copy in the
#      same run (JSON names end in $TAG, default empty)
#   4. Nsight Compute summary of quantize v2 at 64 MB
#   5. compute-sanitizer memcheck / racecheck on quantize, refit and kv_append subsets
# Outputs in $OUT/fast/, tarred to $OUT/fast.tar.
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_fast_blocks.sh
set -uo pipefail
OUT=${OUT:-runs/fast_blocks}
BUDGET=${BUDGET:-560}
W="$OUT/fast"; mkdir -p "$W"; trap 'tar -cf "$OUT/fast.tar" -C "$W" .' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
export TRACE_KERNELS_PTXAS_CHECK=1
echo "== build ($(left)s left)"
timeout 200 python3 profiling/prebuild_memory_kernels.py nvfp4_quantize_bf16_v2_d2048 nvfp4_quantize_bf16_v4_d2048 \
  kv_append_nvfp4_hkv4_d128 nvfp4_refit_weights_bf16 > "$W/build.log" 2>&1
echo "build exit $?"; grep -E "FAILED|built" "$W/build.log" | head -5

echo "== GPU tests ($(left)s left)"
timeout 200 python3 -m pytest tests/gpu/test_quantize_kernels.py -q -rfE -p no:cacheprovider > "$W/memory_tests.log" 2>&1
echo "memory tests exit $?"; grep -E "^FAILED" "$W/memory_tests.log" | head -8; tail -1 "$W/memory_tests.log"
timeout 60 python3 -m pytest tests/gpu/test_kv_kernels.py -k append -q -rfE -p no:cacheprovider > "$W/kv_append_tests.log" 2>&1
echo "kv_append tests exit $?"; grep -E "^FAILED" "$W/kv_append_tests.log" | head -5; tail -1 "$W/kv_append_tests.log"

echo "== bench ($(left)s left)"
timeout 150 python3 profiling/bench_memory_kernels.py --select quantize:v2,quantize:v4,quantize_cta,guided_fake_quantize:v4,refit_weights:v2,refit_weights:v3,refit_weights:v4 \
  --sizes-mb 64,256,1024 --copy-study-mb "" --no-host-overhead --out "$W/memory_fast_blocks_h200${TAG:-}.json" > "$W/bench.log" 2>&1
echo "bench exit $?"; grep -E "copy|quantize|refit" "$W/bench.log" | head -30
timeout 90 python3 profiling/bench_attention.py --append-only --out "$W/kv_append_h200${TAG:-}.json" > "$W/kv_append_bench.log" 2>&1
echo "kv bench exit $?"; grep -E "copy|kv_append" "$W/kv_append_bench.log"

echo "== ncu quantize v2 ($(left)s left)"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 60 "$NCU" --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
  --section Occupancy --section SchedulerStats --section InstructionStats -k regex:nvfp4_ --launch-skip 1 --launch-count 1 \
  python3 profiling/ncu_memory_case.py quantize:v2 --mb 64 > "$W/ncu_quantize_v2.txt" 2>&1
echo "ncu exit $?"; grep -E "Duration|DRAM Throughput|Issue Slots Busy|Registers Per|Executed Instructions  |highest-utilized" "$W/ncu_quantize_v2.txt" | head -8

for tool in memcheck racecheck; do
  t=$(( $(left) - 10 ))
  [ "$t" -lt 20 ] && { echo "no time for $tool"; continue; }
  echo "== $tool ($(left)s left)"
  timeout "$t" compute-sanitizer --report-api-errors no --error-exitcode 9 --print-limit 50 --tool $tool \
    python3 -m pytest tests/gpu/test_quantize_kernels.py tests/gpu/test_kv_kernels.py -q -p no:cacheprovider \
    -k "(quantize or refit or append) and not guided and not large and not many_rows and not (bitexact and 8192)" \
    > "$W/$tool.log" 2>&1
  echo "$tool exit $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$W/$tool.log" | tail -3
done
echo "== done ($(left)s left)"
