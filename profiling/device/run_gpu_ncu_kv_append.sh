#!/usr/bin/env bash
# Nsight Compute on kv_append's default NVFP4 kernel (256K tokens x 4 kv heads x 128, shuffled slots;
# profiling/ncu_memory_case.py kv_append: a warm-up launch, then the profiled one). The command of
# profiling/results/ncu_kv_append_b2_h200.txt (H200, 2026-12-02; there the report went to $OUT/kva).
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_ncu_kv_append.sh
set -uo pipefail
OUT=${OUT:-runs/ncu_kv_append}
mkdir -p "$OUT"
source profiling/device/gpu_env.sh "$OUT/pip.log"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 150 "$NCU" --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section WarpStateStats --section Occupancy --section SchedulerStats --section InstructionStats \
  --section MemoryWorkloadAnalysis -k regex:kv_append --launch-skip 1 --launch-count 1 -o "$OUT/kva" \
  python3 profiling/ncu_memory_case.py kv_append > "$OUT/ncu_kv_append.log" 2>&1
echo "ncu exit $?"
"$NCU" --import "$OUT/kva.ncu-rep" --page details > "$OUT/ncu_kv_append_b2.txt" 2>&1
"$NCU" --import "$OUT/kva.ncu-rep" --page raw --csv > "$OUT/ncu_kv_append_b2.raw.csv" 2>&1
rm -f "$OUT/kva.ncu-rep"
grep -E "Duration|DRAM Throughput|Issue Slots Busy|Registers Per|Achieved Active Warps|Eligible Warps|Active Warps Per Scheduler|Warp Cycles Per Issued" \
  "$OUT/ncu_kv_append_b2.txt" | head -12
