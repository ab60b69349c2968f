#!/usr/bin/env bash
# kv_append on the H200 (< 4 min): its GPU tests (b1, b2, b4 and BF16 bit-exact against the
# reference, guidance, bad input), memcheck on the b2 / b4 cases, then bench_attention --append-only
# (NVFP4 b1 / b2 / b4 with and without guidance, BF16 pages; 64K and 256K tokens; copy bandwidth in
# the same run). The committed kv_append_h200.json predates b4 (b1 and b2 only).
# Outputs in $OUT/kva/, packed into $OUT/kva.tar.
# Usage (repo root; carry .whl and .tkcache): bash profiling/device/run_gpu_checks_kv_append.sh
set -uo pipefail
OUT=${OUT:-runs/kv_append}
BUDGET=${BUDGET:-230}
W="$OUT/kva"
mkdir -p "$W"
trap 'tar -cf "$OUT/kva.tar" -C "$W" . && rm -rf "$W"' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"

echo "== kv_append GPU tests ($(left)s left)"
timeout 90 python3 -m pytest tests/gpu/test_kv_kernels.py -k append -q -rfE -p no:cacheprovider \
  > "$W/kv_append_tests.log" 2>&1
echo "tests exit $?"; tail -2 "$W/kv_append_tests.log"

echo "== kv_append bench ($(left)s left)"
timeout 100 python3 profiling/bench_attention.py --append-only --out "$W/kv_append_h200.json" > "$W/kv_append_bench.log" 2>&1
echo "bench exit $?"; grep -E "copy|kv_append" "$W/kv_append_bench.log"

t=$(( $(left) - 5 ))
if [ "$t" -gt 20 ]; then
  echo "== memcheck on the b2 / b4 append tests (${t}s)"
  timeout "$t" compute-sanitizer --report-api-errors no --error-exitcode 9 --print-limit 100 --tool memcheck \
    python3 -m pytest tests/gpu/test_kv_kernels.py -q -p no:cacheprovider -k "append and (b2 or b4)" > "$W/kv_append_memcheck.log" 2>&1
  echo "memcheck exit $?"; grep -E "ERROR SUMMARY|passed|failed" "$W/kv_append_memcheck.log" | tail -3
fi
echo "== done ($(left)s left)"
