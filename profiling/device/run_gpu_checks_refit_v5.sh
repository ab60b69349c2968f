#!/usr/bin/env bash
# A record: it names memory-kernel variants removed on 2026-12-05 (refit_weights v1, v3-v7, v10, v11; quantize v1,
# v4; guided_fake_quantize v1-v6 as variants), so it runs as written only on commit 32f5e89 or earlier.
# Issue 3: refit v5 (work queue overlapping the amax stream of one chunk of experts with the quantize
# of the previous one) on the H200 (< 5 min): the refit GPU tests (every variant; forced v5 plans),
# bench_memory_kernels.py refit v2 / v5 at 64 MB .. 1 GB with the copy in the same run, then
# compute-sanitizer memcheck and racecheck on the v5 tests. Outputs in $OUT/r5/, tarred to $OUT/r5.tar.
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_refit_v5.sh
set -uo pipefail
OUT=${OUT:-runs/refit_v5}
BUDGET=${BUDGET:-280}
W="$OUT/r5"; mkdir -p "$W"; trap 'tar -cf "$OUT/r5.tar" -C "$W" .' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
echo "== refit GPU tests ($(left)s left)"
timeout 100 python3 -m pytest tests/gpu/test_quantize_kernels.py -k refit -q -rfE -p no:cacheprovider > "$W/refit_tests.log" 2>&1
echo "tests exit $?"; grep -E "^FAILED" "$W/refit_tests.log" | head -6; tail -1 "$W/refit_tests.log"
echo "== bench ($(left)s left)"
timeout 70 python3 profiling/bench_memory_kernels.py --select refit_weights:v2,refit_weights:v5 --sizes-mb 64,256,1024 \
  --copy-study-mb "" --no-host-overhead --out "$W/memory_refit_v5_h200.json" > "$W/bench.log" 2>&1
echo "bench exit $?"; grep -E "copy|refit" "$W/bench.log"
for tool in memcheck racecheck; do
  t=$(( $(left) - 5 ))
  [ "$t" -lt 15 ] && { echo "no time for $tool"; continue; }
  echo "== $tool ($(left)s left)"
  timeout "$t" compute-sanitizer --report-api-errors no --error-exitcode 9 --print-limit 50 --tool $tool \
    python3 -m pytest tests/gpu/test_quantize_kernels.py -q -p no:cacheprovider -k "refit and v5 and not large" \
    > "$W/$tool.log" 2>&1
  echo "$tool exit $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$W/$tool.log" | tail -2
done
echo "== done ($(left)s left)"
