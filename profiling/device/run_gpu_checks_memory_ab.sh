#!/usr/bin/env bash
# A record: it names memory-kernel variants removed on 2026-12-05 (refit_weights v1, v3-v7, v10, v11; quantize v1,
# v4; guided_fake_quantize v1-v6 as variants), so it runs as written only on commit 32f5e89 or earlier.
# Issue 3 A/B of the software-pipelined guided_fake_quantize v4 on the H200 (<= 120 s, every step
# under `timeout`): v4 (v3 with the next pass's loads in flight) against v2 and v3, and the
# quantize default (v2) in the same run. The run of 2026-11-29 (profiling/results/memory_ab_h200.json)
# also measured a quantize v3 (a persistent row loop with the next row's loads in flight): it was
# slower than v2 (54-61% against 70-75% of copy) and was not kept (docs/toolchain.md).
#   1. the memory kernels from the carried JIT cache (a cache miss compiles, if nvcc is there)
#   2. the GPU tests of the new variants only (bit-exact vs the reference, several passes per CTA)
#   3. compute-sanitizer memcheck on the multi-pass and non-finite tests of the new variants
#      (racecheck too when time is left)
#   4. profiling/bench_memory_kernels.py: quantize v2, guided v2/v3/v4, 64 and 256 MB, JSON
# Bench before the sanitizers, so the numbers never lose their time to a slow sanitizer start.
# Everything goes to $OUT/mem/, tarred to $OUT/mem.tar at the end (the folder is then removed).
# Usage (repo root, carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_memory_ab.sh
set -uo pipefail
OUT=${OUT:-runs/memory_ab}
BUDGET=${BUDGET:-118}  # seconds for the whole script (build 12 + tests 38 + bench 45 + sanitizers the rest)
DIR="$OUT/mem"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"  # wheels, PYTHONPATH, JIT cache in .tkcache
export TRACE_KERNELS_PTXAS_CHECK=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv >> "$DIR/setup.log" 2>&1

timeout 12 python3 -c "
import time
from trace_kernels import jit
from trace_kernels.testing.kernel_sets import memory_kernel_specs
t = time.time()
specs = memory_kernel_specs()
entries = jit.build_all(specs, jobs=16, keep_going=True)
bad = [(s.name, str(e)[-600:]) for s, e in zip(specs, entries) if isinstance(e, Exception)]
for name, error in bad: print('FAILED', name, error)
shown = ('nvfp4_quantize_bf16_v2_d2048', 'nvfp4_guided_fake_quantize_bf16_v3_d2048',
         'nvfp4_guided_fake_quantize_bf16_v4_d2048')
for s, e in zip(specs, entries):
    if s.name.startswith(shown) and not isinstance(e, Exception):
        print(s.name, (e.folder / 'ptxas.txt').read_text().strip().splitlines()[-2][14:])
print(f'built/verified {len(specs) - len(bad)} of {len(specs)} memory kernels in {time.time() - t:.1f}s')" \
  > "$DIR/build.log" 2>&1
echo "build exit: $?" | tee -a "$DIR/build.log"; tail -6 "$DIR/build.log"

NEW="guided and v4"
timeout 38 python3 -m pytest tests/gpu/test_quantize_kernels.py -q -rfE --maxfail=20 -p no:cacheprovider -k "$NEW" \
  > "$DIR/gpu_tests.log" 2>&1
echo "gpu tests exit: $? (124 = step time limit)" | tee -a "$DIR/gpu_tests.log"; tail -8 "$DIR/gpu_tests.log"

SELECT=quantize:v2,guided_fake_quantize:v2,guided_fake_quantize:v3,guided_fake_quantize:v4
timeout 45 python3 profiling/bench_memory_kernels.py --select "$SELECT" --sizes-mb 64,256 --copy-study-mb "" \
  --no-host-overhead --out "$DIR/memory_ab_h200.json" > "$DIR/bench.log" 2>&1
echo "bench exit: $?" | tee -a "$DIR/bench.log"; tail -32 "$DIR/bench.log"

SAN="compute-sanitizer --error-exitcode 9 --print-limit 50 --report-api-errors no"
SMALL="(persistent and guided and v4) or (nonfinite and v4-v1)"
RACE="persistent and guided and v4 and compact"
for tool in memcheck racecheck; do
  [ "$tool" = memcheck ] && subset=$SMALL || subset=$RACE
  limit=$(( $(left) - 2 ))
  if [ "$limit" -lt 12 ]; then echo "$tool: skipped, ${limit}s left" | tee "$DIR/sanitizer_$tool.log"; continue; fi
  [ "$tool" = memcheck ] && [ "$limit" -gt 22 ] && limit=22
  timeout "$limit" $SAN --tool $tool python3 -m pytest tests/gpu/test_quantize_kernels.py -q -p no:cacheprovider \
    -k "$subset" > "$DIR/sanitizer_$tool.log" 2>&1
  echo "$tool exit: $? (limit ${limit}s; 124 = step time limit)" | tee -a "$DIR/sanitizer_$tool.log"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$DIR/sanitizer_$tool.log" | tail -3
done
echo "total ${SECONDS}s" | tee "$DIR/total.txt"
tar cf "$OUT/mem.tar" -C "$OUT" mem && rm -rf "$DIR"  # one file back (the device returns at most 8)
