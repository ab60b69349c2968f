#!/usr/bin/env bash
# A record: it names decode-attention variants removed on 2026-12-05 (simt, mma on NVFP4 pages, mma2 and its
# sweep configurations, mma3, mma4), so it runs as written only on commit 9d9c541 or earlier.
# Issue 5 A/B of the NVFP4 decode-attention kernels on the H200 (<= 4 minutes, every step under
# `timeout`): the kernels from the carried JIT cache (ptxas report), the decode GPU tests of the
# NVFP4 tensor-core variants (mma, mma2, mma3; simt and the BF16 kernels are unchanged), the
# decode benchmark of the four issue-5 cases (NVFP4 mma / mma2 / mma3, BF16 mma, SDPA over a
# contiguous BF16 cache, copy roofline from an eager copy and an SM copy kernel in the same run),
# then compute-sanitizer memcheck and racecheck on small mma3 / mma2 cases with the time left.
# Seven files go to ${OUT:-runs/attention_ab}.
# Usage (repo root, carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_attention_ab.sh
set -uo pipefail
OUT=${OUT:-runs/attention_ab}
BUDGET=${BUDGET:-235}  # seconds for the whole script (build 30 + tests 75 + bench 70 + sanitizers the rest)
mkdir -p "$OUT"
source profiling/device/gpu_env.sh "$OUT/setup.log"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv >> "$OUT/setup.log" 2>&1

timeout 30 python3 profiling/bench_attention.py --build-only 16 > "$OUT/build.log" 2>&1
echo "build exit: $?" | tee -a "$OUT/build.log"; tail -1 "$OUT/build.log"

# decode tests of the NVFP4 tensor-core kernels, plus the CUDA-graph and bad-input tests (default variant)
timeout 75 python3 -m pytest tests/gpu/test_kv_kernels.py -q -rfE -p no:cacheprovider -k "decode and not simt and not bf16" \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests exit: $?" | tee -a "$OUT/gpu_tests.log"; tail -12 "$OUT/gpu_tests.log"

timeout 70 python3 profiling/bench_attention.py --decode-only --nvfp4-variants mma,mma2,mma3 --bf16-variants mma \
  --out "$OUT/attention_ab_h200.json" > "$OUT/bench.log" 2>&1
echo "bench exit: $?" | tee -a "$OUT/bench.log"; grep -vE '^\{' "$OUT/bench.log" | tail -30

# GQA 1 D 64 (P 16) and GQA 8 D 128 (P 64), 3 splits (so the combine runs too)
SMALL="matches_reference and -3] and ((mma3 and (lengths0 or lengths2)) or (mma2 and lengths0))"
for tool in memcheck racecheck; do
  [ "$tool" = memcheck ] && limit=$(( $(left) / 2 )) || limit=$(left)
  if [ "$limit" -lt 25 ]; then echo "$tool: skipped, ${limit}s left" | tee "$OUT/sanitizer_$tool.log"; continue; fi
  timeout "$limit" compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 --print-limit 20 \
    python3 -m pytest tests/gpu/test_kv_kernels.py -q -p no:cacheprovider -k "$SMALL" > "$OUT/sanitizer_$tool.log" 2>&1
  echo "$tool exit: $? (limit ${limit}s)" | tee -a "$OUT/sanitizer_$tool.log"; tail -4 "$OUT/sanitizer_$tool.log"
done
echo "total ${SECONDS}s"
