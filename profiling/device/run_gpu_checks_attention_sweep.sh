#!/usr/bin/env bash
# A record: it names decode-attention variants removed on 2026-12-05 (simt, mma on NVFP4 pages, mma2 and its
# sweep configurations, mma3, mma4), so it runs as written only on commit 9d9c541 or earlier.
# Issue 5: occupancy sweep of the NVFP4 decode kernel mma2 on the H200 (<= 110 s, every step under
# `timeout`). The configurations are decode_attention.MMA2_SWEEP_VARIANTS (warps per CTA x cp.async
# stages, e.g. mma2_w1s2; one mma3 at 1 warp), each its own kernel next to the unchanged default mma2:
#   (0) the kernels from the carried JIT cache: registers / spills / smem per kernel (build.log)
#   (1) the decode GPU tests of the sweep configurations (three shapes, splits planned and 3; the
#       growing-score rescale case)
#   (2) the decode benchmark of the four issue-5 cases: mma2 + the configurations, SDPA over a
#       contiguous BF16 cache and the copy roofline in the same run (JSON; the table lists CTAs per SM
#       from the occupancy query, splits and tiles per split of every contender)
#   (3) with the time left: Nsight Compute on the default mma2 at (B, L) = (32, 32K) (speed of light,
#       occupancy, warp states, memory and compute workload, instruction mix), then the same on mma2_w1s2
#       (section pages and raw metrics; the .ncu-rep itself is not kept).
# Everything goes to $OUT/attn/, tarred to $OUT/attn.tar at the end.
# Usage (repo root, carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_attention_sweep.sh
set -uo pipefail
OUT=${OUT:-runs/attention_sweep}
BUDGET=${BUDGET:-110}  # seconds for the whole script
A="$OUT/attn"
mkdir -p "$A"
source profiling/device/gpu_env.sh "$A/setup.log"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv
  ncu --version | tail -1; } >> "$A/setup.log" 2>&1

tar_on_exit "$A"

# (0) cache hits only when the headers are unchanged since the prebuild (else nvcc builds the misses)
TRACE_KERNELS_PTXAS_CHECK=1 timeout 20 python3 profiling/bench_attention.py --build-only 16 --build-named-only --nvfp4-variants sweep \
  > "$A/build.log" 2>&1
echo "build exit: $?" | tee -a "$A/build.log"; tail -1 "$A/build.log"

# (1) correctness of the configurations
timeout 30 python3 -m pytest tests/gpu/test_kv_kernels.py -q -rfE -p no:cacheprovider -k "sweep_config" \
  > "$A/gpu_tests.log" 2>&1
echo "gpu tests exit: $? (${SECONDS}s)" | tee -a "$A/gpu_tests.log"; tail -6 "$A/gpu_tests.log"

# (2) the benchmark: mma2 (default) + MMA2_SWEEP_VARIANTS, SDPA, copy
limit=$(( $(left) > 50 ? 50 : $(left) - 5 ))
timeout "$limit" python3 profiling/bench_attention.py --decode-only --nvfp4-variants sweep --bf16-variants "" \
  --out "$A/attention_sweep_h200.json" > "$A/bench.log" 2>&1
echo "bench exit: $? (limit ${limit}s, ${SECONDS}s)" | tee -a "$A/bench.log"; grep -vE '^\{' "$A/bench.log" | tail -40

# (3) ncu on (32, 32K): the default kernel first, then the 16-warp one-warp-CTA configuration (gpu_env.sh's
# ncu_report: the section pages and every collected metric, e.g. the per-pipe utilisation).
for variant in mma2 mma2_w1s2; do
  limit=$(( $(left) - 12 ))
  if [ "$limit" -lt 18 ]; then echo "ncu $variant: skipped, $(left)s left" | tee -a "$A/setup.log"; continue; fi
  ncu_report "$A/ncu_${variant}_b32_l32k" "$limit" "decode_attention_nvfp4_${variant}_hq" \
    python3 profiling/bench_attention.py --ncu-case 32,32768 --nvfp4-variants "$variant"
done
