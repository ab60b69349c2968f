#!/usr/bin/env bash
# Issue 3 / 5 probes on the H200 (< 4 min): quantize v2 at 64 / 128 / 256 threads per block
# (bench_memory_kernels.py --select quantize:v2,quantize_cta; the tail of a 5-wave grid), then Nsight
# Compute on kv_append NVFP4 (default b2, 256K tokens x 4 kv heads, shuffled slots): SOL, memory
# workload, warp state, and per-SASS-instruction counts. Outputs in $OUT/probe/, tarred to $OUT/probe.tar.
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_quantize_cta_kv_ncu.sh
set -uo pipefail
W="$OUT/probe"; mkdir -p "$W"; trap 'tar -cf "$OUT/probe.tar" -C "$W" .' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
timeout 150 python3 profiling/bench_memory_kernels.py --select quantize:v2,quantize_cta --sizes-mb 64,256,1024 \
  --copy-study-mb "" --no-host-overhead --out "$W/memory_quantize_cta_h200.json" > "$W/bench.log" 2>&1
echo "bench exit $?"; grep -E "copy|quantize" "$W/bench.log"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for c in kv_append kv_append+guidance; do
  n=${c//+/_}
  timeout 60 "$NCU" --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section Occupancy --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters -k regex:nvfp4_ \
    --launch-skip 1 --launch-count 1 -o "$W/$n" -f python3 profiling/ncu_memory_case.py "$c" > "$W/$n.log" 2>&1
  echo "$c ncu exit $?"
  "$NCU" --import "$W/$n.ncu-rep" > "$W/$n.txt" 2>&1
  "$NCU" --import "$W/$n.ncu-rep" --page source --print-source sass --csv > "$W/$n.csv" 2> /dev/null
  rm -f "$W/$n.ncu-rep"
  grep -E "Duration|DRAM Throughput|Issue Slots Busy|Registers Per|Achieved Occupancy|highest-utilized|L2 Hit|Mem Busy|Max Bandwidth" "$W/$n.txt" | head -10
done
