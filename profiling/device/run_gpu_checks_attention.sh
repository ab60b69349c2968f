#!/usr/bin/env bash
# Issue 5 on the H200 in one go (~8 minutes at most): build the KV kernels (ptxas report), GPU
# tests, the attention benchmark, then compute-sanitizer memcheck + racecheck on small cases with
# the time that is left. Logs + JSON go to ${OUT:-runs/attention}.
# Usage (repo root): PYTHONPATH=python bash profiling/device/run_gpu_checks_attention.sh
set -uo pipefail
OUT=${OUT:-runs/attention}
BUDGET=${BUDGET:-460}  # seconds for the whole script
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export TRACE_KERNELS_CACHE_DIR=${TRACE_KERNELS_CACHE_DIR:-$PWD/.tkcache}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
timeout 60 python3 -c "
import time; t = time.time()
from trace_kernels import kv_testing
print('\n'.join(kv_testing.build_report(jobs=16))); print(f'built in {time.time() - t:.1f}s')" 2>&1 | tee "$OUT/build.log" | tail -3
timeout 180 python3 -m pytest tests/gpu/test_kv_kernels.py -q -rfE -p no:cacheprovider 2>&1 \
  | tee "$OUT/gpu_tests.log" | tail -30
timeout 130 python3 profiling/bench_attention.py --fill-gb 20 --out "$OUT/attention_h200.json" 2>&1 \
  | tee "$OUT/bench.log" | tail -20
SMALL="(matches_reference and lengths0 and -3]) or (kv_append_bit_exact and lengths0)"  # every decode variant
for tool in memcheck racecheck; do
  [ "$tool" = memcheck ] && left=$(( (BUDGET - SECONDS) / 2 )) || left=$(( BUDGET - SECONDS ))
  if [ "$left" -lt 20 ]; then echo "$tool: skipped, ${left}s left" | tee "$OUT/sanitizer_$tool.log"; continue; fi
  timeout "$left" compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 --print-limit 20 \
    python3 -m pytest tests/gpu/test_kv_kernels.py -q -p no:cacheprovider -k "$SMALL" > "$OUT/sanitizer_$tool.log" 2>&1
  echo "$tool exit: $? (limit ${left}s)" | tee -a "$OUT/sanitizer_$tool.log"; tail -4 "$OUT/sanitizer_$tool.log"
done
