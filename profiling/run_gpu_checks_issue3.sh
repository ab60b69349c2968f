#!/usr/bin/env bash
# Issue 3 on the H200: build the kernels, GPU tests, the memory-kernel benchmark, then
# compute-sanitizer memcheck + racecheck on the small GPU tests. Logs and JSON go to ${OUT:-runs/issue3}.
# Usage (repo root): PYTHONPATH=python bash profiling/run_gpu_checks_issue3.sh
set -uo pipefail
OUT=${OUT:-runs/issue3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export TRACE_KERNELS_CACHE_DIR=${TRACE_KERNELS_CACHE_DIR:-$PWD/.tkcache}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "
import time; t=time.time()
from trace_kernels import jit
from trace_kernels.testing.kernel_sets import memory_kernel_specs
specs = memory_kernel_specs(); jit.build_all(specs, jobs=16)
print(f'built/verified {len(specs)} kernels in {time.time()-t:.1f}s')" 2>&1 | tee "$OUT/build.log"
# SASS facts: instruction count, 16-byte global accesses, no local memory (LDL/STL)
for name in nvfp4_quantize_bf16_d2048 nvfp4_guided_fake_quantize_bf16_d2048 nvfp4_refit_weights_bf16; do
  cubin=$(ls -d "$TRACE_KERNELS_CACHE_DIR"/v1/${name}_sm90a-*/kernel.cubin | head -1)
  cuobjdump -sass "$cubin" > /tmp/sass.txt
  echo "$name: $(grep -c 'LDG.E.128\|LDG.E.ENL2.128\|LDG.E.EF.128' /tmp/sass.txt) LDG.128, $(grep -c 'STG.E.128' /tmp/sass.txt) STG.128, $(grep -cE 'LDL|STL' /tmp/sass.txt) LDL/STL, $(grep -c 'MUFU' /tmp/sass.txt) MUFU, $(grep -c 'FSET' /tmp/sass.txt) FSET" | tee -a "$OUT/build.log"
done
python3 -m pytest tests/gpu/test_quantize_kernels.py -q -rfE --maxfail=15 -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -45
python3 profiling/bench_memory_kernels.py --out "$OUT/memory_kernels_h200.json" 2>&1 | tee "$OUT/bench.log"
SAN="compute-sanitizer --error-exitcode 9 --print-limit 200 --report-api-errors no"
for tool in memcheck racecheck; do
  timeout ${SAN_TIMEOUT:-120} $SAN --tool $tool python3 -m pytest tests/gpu/test_quantize_kernels.py -q -p no:cacheprovider \
    -k "not large and (bitexact or nonfinite or forced or many_rows) and (16 or 768 or 33-96 or 3-4096 or nonfinite or forced or many_rows)" \
    > "$OUT/sanitizer_$tool.log" 2>&1
  echo "$tool exit: $?" | tee -a "$OUT/sanitizer_$tool.log"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$OUT/sanitizer_$tool.log" | tail -4
  grep -m 12 -E "^========= [A-Z]" "$OUT/sanitizer_$tool.log"
done
