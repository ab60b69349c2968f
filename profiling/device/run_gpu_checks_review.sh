#!/usr/bin/env bash
# A record: it names memory-kernel variants removed on 2026-12-05 (refit_weights v1, v3-v7, v10, v11; quantize v1,
# v4; guided_fake_quantize v1-v6 as variants), so it runs as written only on commit 32f5e89 or earlier.
# After the review refactors (shared row-block loads in quantize v2/v4; shared CTA amax, amax
# publication and bounded waits in refit v1/v3/v4/v5) on the H200 (< 3 min): the quantize and refit
# GPU tests (every variant), then memcheck and racecheck on the refit tests of the waiting variants.
# Outputs in $OUT/rev/, tarred to $OUT/rev.tar.
# Usage (repo root; carry .whl and .tkcache, prebuilt by profiling/prebuild_memory_kernels.py):
#   OUT=$OUT bash profiling/device/run_gpu_checks_review.sh
set -uo pipefail
OUT=${OUT:-runs/review}
BUDGET=${BUDGET:-170}
W="$OUT/rev"; mkdir -p "$W"; trap 'tar -cf "$OUT/rev.tar" -C "$W" .' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
echo "== quantize and refit GPU tests ($(left)s left)"
timeout 100 python3 -m pytest tests/gpu/test_quantize_kernels.py -k "not guided" -q -rfE -p no:cacheprovider \
  > "$W/tests.log" 2>&1
echo "tests exit $?"; grep -E "^FAILED" "$W/tests.log" | head -6; tail -1 "$W/tests.log"
for tool in memcheck racecheck; do
  t=$(( $(left) - 5 ))
  [ "$t" -lt 15 ] && { echo "no time for $tool"; continue; }
  echo "== $tool ($(left)s left)"
  timeout "$t" compute-sanitizer --report-api-errors no --error-exitcode 9 --print-limit 50 --tool $tool \
    python3 -m pytest tests/gpu/test_quantize_kernels.py -q -p no:cacheprovider \
    -k "refit and not large and not guided and (v1 or v3 or v4 or v5 or forced)" > "$W/$tool.log" 2>&1
  echo "$tool exit $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$W/$tool.log" | tail -2
done
echo "== done ($(left)s left)"
