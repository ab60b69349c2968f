#!/usr/bin/env bash
# A record: it names memory-kernel variants removed on 2026-12-05 (refit_weights v1, v3-v7, v10, v11; quantize v1,
# v4; guided_fake_quantize v1-v6 as variants), so it runs as written only on commit 32f5e89 or earlier.
# guided_fake_quantize v3 A/B on the H200 (< 4 minutes): build the guided kernels (every variant,
# spills fail the build), the guided GPU tests for every variant, compute-sanitizer memcheck +
# racecheck on a small v3 subset, and the benchmark of the guided op only (v1, v2, v3; 64 / 256 /
# 1024 MB; no copy study). Logs and JSON go to ${OUT:-runs/guided_v3}.
# Usage (repo root): OUT=$OUT bash profiling/device/run_gpu_checks_guided_v3.sh
set -uo pipefail
OUT=${OUT:-runs/guided_v3}
mkdir -p "$OUT"
source profiling/device/gpu_env.sh "$OUT/setup.log"  # wheels, PYTHONPATH, JIT cache
export PYTHONUNBUFFERED=1
export TRACE_KERNELS_CACHE_DIR=${TRACE_KERNELS_CACHE_DIR:-$PWD/.tkcache}
export TRACE_KERNELS_PTXAS_CHECK=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"

timeout 40 python3 -c "
from trace_kernels import jit
from trace_kernels.testing.kernel_sets import memory_kernel_specs
specs = [s for s in memory_kernel_specs() if s.op == 'nvfp4_guided_fake_quantize']
entries = jit.build_all(specs, jobs=16, keep_going=True)
bad = [(s.name, str(e)[-600:]) for s, e in zip(specs, entries) if isinstance(e, Exception)]
for name, error in bad: print('FAILED', name, error)
print(f'built/verified {len(specs) - len(bad)} of {len(specs)} guided kernels')" > "$OUT/build.log" 2>&1
echo "build exit: $?" | tee -a "$OUT/build.log"; tail -3 "$OUT/build.log"

timeout 60 python3 -m pytest tests/gpu/test_quantize_kernels.py -q -rfE --maxfail=20 -p no:cacheprovider -k "guided" \
  > "$OUT/gpu_tests.log" 2>&1
echo "guided gpu tests exit: $?" | tee -a "$OUT/gpu_tests.log"; tail -15 "$OUT/gpu_tests.log"

SAN="compute-sanitizer --error-exitcode 9 --print-limit 200 --report-api-errors no"
SUBSET="guided and v3 and not large and (grid_edges or 7-64 or 33-768 or nonfinite)"
for tool in memcheck racecheck; do
  timeout 40 $SAN --tool $tool python3 -m pytest tests/gpu/test_quantize_kernels.py -q -p no:cacheprovider -k "$SUBSET" \
    > "$OUT/sanitizer_$tool.log" 2>&1
  echo "$tool exit: $? (124 = step time limit)" | tee -a "$OUT/sanitizer_$tool.log"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$OUT/sanitizer_$tool.log" | tail -3
done

timeout 75 python3 profiling/bench_memory_kernels.py --select guided_fake_quantize --sizes-mb 64,256,1024 \
  --copy-study-mb "" --no-host-overhead --out "$OUT/guided_v3_h200.json" > "$OUT/bench.log" 2>&1
echo "bench exit: $?" | tee -a "$OUT/bench.log"; tail -14 "$OUT/bench.log"
tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.log gpu.txt 2>/dev/null) && rm -f "$OUT"/*.log
