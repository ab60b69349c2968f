#!/usr/bin/env bash
# A record: it names memory-kernel variants removed on 2026-12-05 (refit_weights v1, v3-v7, v10, v11; quantize v1,
# v4; guided_fake_quantize v1-v6 as variants), so it runs as written only on commit 32f5e89 or earlier.
# Nsight Compute on the three memory-bound kernels at 64 MB (what limits them: SOL, pipes, stalls,
# instruction mix, occupancy), the SASS opcode histogram of each cubin, then kv_append's checks.
# Outputs in $OUT/mncu/, packed into $OUT/mncu.tar.
# Usage (repo root; carry .whl and .tkcache): bash profiling/device/run_gpu_checks_memory_ncu.sh
set -uo pipefail
OUT=${OUT:-runs/memory_ncu}
BUDGET=${BUDGET:-420}
W="$OUT/mncu"
mkdir -p "$W"
trap 'tar -cf "$OUT/mncu.tar" -C "$W" . && rm -rf "$W"' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy
  --section LaunchStats --section InstructionStats --section MemoryWorkloadAnalysis --section SchedulerStats"
CASES=${CASES:-"quantize:v2 quantize+guidance:v2 guided-compact:v4 guided-compact-counters:v4 guided-full:v4 refit:v2 refit:v3"}
for c in $CASES; do
  skip=1; count=1
  [ "$c" = "refit:v2" ] && { skip=2; count=2; }
  echo "== ncu $c ($(left)s left)"
  timeout 90 "$NCU" --clock-control none $SECTIONS -k regex:'nvfp4_' --launch-skip $skip --launch-count $count \
    python3 profiling/ncu_memory_case.py "$c" --mb 64 > "$W/ncu_${c//[:+]/_}.txt" 2>&1
  echo "exit $?"; grep -E "Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Registers Per|Achieved Occupancy" "$W/ncu_${c//[:+]/_}.txt" | head -8
done
echo "== SASS opcode histograms"
OBJDUMP=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
for f in $(find "$TRACE_KERNELS_CACHE_DIR" -name '*.cubin' | grep -E 'quantize.*d2048|refit'); do
  "$OBJDUMP" -sass "$f" > "$W/$(basename "$(dirname "$f")").sass" 2>&1
done
ls "$W"/*.sass 2>/dev/null | head -30
[ "${KV:-1}" = 1 ] && OUT="$W" BUDGET=$(( $(left) - 5 )) bash profiling/device/run_gpu_checks_kv_append.sh
echo "== done ($(left)s left)"
