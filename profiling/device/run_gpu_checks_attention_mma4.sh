#!/usr/bin/env bash
# A record: it names decode-attention variants removed on 2026-12-05 (simt, mma on NVFP4 pages, mma2 and its
# sweep configurations, mma3, mma4), so it runs as written only on commit 9d9c541 or earlier.
# Issue 5: the whole-page NVFP4 decode kernel mma4 (attention_decode_mma4.cuh) on the H200, one call
# (<= BUDGET s, every step under `timeout`):
#   (0) the kernels from the carried JIT cache (registers / spills; nvcc builds any miss)
#   (1) every KV GPU test (append and decode: mma4 and its configurations in the main matrix, the sweep
#       tests, bytes past the end poisoned, CUDA graph; kv_append's non-finite status bit)
#   (2) compute-sanitizer memcheck and racecheck on small mma4 cases
#   (3) the decode benchmark of the issue-5 cases: the default mma2_w2s2, mma4 and its configurations,
#       SDPA over a contiguous BF16 cache, the copy roofline, same run (JSON)
#   (4) with the time left: Nsight Compute on mma4 at (B, L) = (32, 32K)
# Everything goes to $OUT/attn/, tarred to $OUT/attn.tar at the end.
# Usage (repo root, carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_attention_mma4.sh
set -uo pipefail
OUT=${OUT:-runs/attention_mma4}
BUDGET=${BUDGET:-540}
A="$OUT/attn"
mkdir -p "$A"
source profiling/device/gpu_env.sh "$A/setup.log"
tar_on_exit "$A"
log_machine "$A/setup.log"

# (0)
TRACE_KERNELS_PTXAS_CHECK=1 timeout 150 python3 profiling/bench_attention.py --build-only 16 --nvfp4-variants sweep,sweep4 \
  > "$A/build.log" 2>&1
echo "build exit: $? (${SECONDS}s)" | tee -a "$A/build.log"; tail -1 "$A/build.log"

# (1)
gpu_tests 200 "$A/gpu_tests.log" tests/gpu/test_kv_kernels.py -x --durations=8

# (2)
for tool in memcheck racecheck; do
  sanitize $tool $(( $(left) > 200 ? 60 : 20 )) "$A/sanitizer_$tool.log" python3 -m pytest tests/gpu/test_kv_kernels.py \
    -q -p no:cacheprovider -x \
    -k "test_decode_ignores_bytes_past_the_end and (lengths0-32-4-128-16-mma4-None or lengths1-8-1-64-64-mma4_w1s2-3)"
done

# (3)
limit=$(( $(left) > 150 ? 120 : $(left) - 20 ))
timeout "$limit" python3 profiling/bench_attention.py --decode-only --nvfp4-variants mma2_w2s2,sweep4 --bf16-variants "" \
  --out "$A/attention_mma4_h200.json" > "$A/bench.log" 2>&1
echo "bench exit: $? (limit ${limit}s, ${SECONDS}s)" | tee -a "$A/bench.log"; grep -vE '^\{' "$A/bench.log" | tail -30

# (4)
for variant in ${NCU_VARIANTS:-mma4}; do
  limit=$(( $(left) - 12 ))
  if [ "$limit" -lt 25 ]; then echo "ncu $variant: skipped, $(left)s left" | tee -a "$A/setup.log"; continue; fi
  ncu_report "$A/ncu_${variant}_b32_l32k" "$limit" "decode_attention_nvfp4_${variant}_hq" \
    python3 profiling/bench_attention.py --ncu-case 32,32768 --nvfp4-variants "$variant"
done
