#!/usr/bin/env bash
# A record: it names memory-kernel variants removed on 2026-12-05 (refit_weights v1, v3-v7, v10, v11; quantize v1,
# v4; guided_fake_quantize v1-v6 as variants), so it runs as written only on commit 32f5e89 or earlier.
# Issue 3: quantize v4 (v2's arithmetic fed by per-warp rings of bulk copies) and refit v4 (tiles
# waiting for their expert's amax in shared memory) on the H200, and the BF16-page kv_append fix
# (< 7 min, every step under `timeout`):
#   1. the memory and kv_append kernels from the carried JIT cache (a miss compiles: 16 jobs)
#   2. the quantize and refit GPU tests, every variant (bit-exact, capped grids, forced v4 plans)
#   3. bench_memory_kernels.py: quantize and refit v2 vs v4, 16 MB .. 1 GB, copy in the same run
#   4. Nsight Compute on quantize v4 and refit v4 at 64 MB (SOL, pipes, stalls)
#   5. compute-sanitizer memcheck and racecheck on the v4 quantize and refit tests
#   6. the kv_append tests and bench (profiling/device/run_gpu_checks_kv_append.sh)
# Everything goes to $OUT/qv4/, tarred to $OUT/qv4.tar at the end.
# Usage (repo root, carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_quantize_v4.sh
set -uo pipefail
OUT=${OUT:-runs/quantize_v4}
BUDGET=${BUDGET:-400}
W="$OUT/qv4"
mkdir -p "$W"
trap 'tar -cf "$OUT/qv4.tar" -C "$W" . && rm -rf "$W"' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
export TRACE_KERNELS_PTXAS_CHECK=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv >> "$W/setup.log" 2>&1

echo "== build ($(left)s left)"
timeout 120 python3 profiling/prebuild_memory_kernels.py nvfp4_quantize_bf16_v2_d2048 nvfp4_quantize_bf16_v4_d2048 > "$W/build.log" 2>&1
echo "build exit $?"; tail -5 "$W/build.log"

echo "== quantize and refit GPU tests ($(left)s left)"
timeout 150 python3 -m pytest tests/gpu/test_quantize_kernels.py -k "not guided" -q -rfE \
  -p no:cacheprovider > "$W/quantize_refit_tests.log" 2>&1
echo "tests exit $?"; grep -E "^FAILED" "$W/quantize_refit_tests.log" | head -10; tail -2 "$W/quantize_refit_tests.log"

echo "== bench ($(left)s left)"
timeout 90 python3 profiling/bench_memory_kernels.py --select quantize:v2,quantize:v4,refit_weights:v2,refit_weights:v4 --sizes-mb 16,64,256,1024 \
  --copy-study-mb "" --no-host-overhead --out "$W/memory_quantize_v4_h200.json" > "$W/bench.log" 2>&1
echo "bench exit $?"; grep -E "copy|quantize|refit" "$W/bench.log" | head -40

echo "== ncu quantize v4 ($(left)s left)"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 60 "$NCU" --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
  --section Occupancy --section SchedulerStats --section MemoryWorkloadAnalysis -k regex:nvfp4_ --launch-skip 1 --launch-count 1 \
  python3 profiling/ncu_memory_case.py quantize:v4 --mb 64 > "$W/ncu_quantize_v4.txt" 2>&1
echo "ncu exit $?"; grep -E "Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Registers Per|Achieved Occupancy|highest-utilized" "$W/ncu_quantize_v4.txt" | head -8
timeout 60 "$NCU" --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
  --section Occupancy --section SchedulerStats --section MemoryWorkloadAnalysis -k regex:nvfp4_ --launch-skip 1 --launch-count 1 \
  python3 profiling/ncu_memory_case.py refit:v4 --mb 64 > "$W/ncu_refit_v4.txt" 2>&1
echo "ncu exit $?"; grep -E "Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Registers Per|Achieved Occupancy|highest-utilized" "$W/ncu_refit_v4.txt" | head -8

for tool in memcheck racecheck; do
  t=$(( $(left) - 100 ))
  [ "$t" -lt 20 ] && { echo "no time for $tool"; continue; }
  echo "== $tool on the v4 quantize and refit tests (${t}s)"
  timeout "$t" compute-sanitizer --report-api-errors no --error-exitcode 9 --print-limit 50 --tool $tool \
    python3 -m pytest tests/gpu/test_quantize_kernels.py -q -p no:cacheprovider \
    -k "v4 and not large and not guided and not many_rows and not (bitexact and 8192)" > "$W/quantize_v4_$tool.log" 2>&1
  echo "$tool exit $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$W/quantize_v4_$tool.log" | tail -3
done

OUT="$W" BUDGET=$(( $(left) - 5 )) bash profiling/device/run_gpu_checks_kv_append.sh
echo "== done ($(left)s left)"
