#!/usr/bin/env bash
# Issue 5: kv_append (the default NVFP4 kernel, with and without guidance, and the BF16 scatter copy) with
# random slots (decode: each token to its sequence's own page) and contiguous slots (prefill), 64K and
# 256K tokens, against a copy measured in the same run. Question: how much of the gap to 85% of copy is the
# scattered write pattern rather than the kernel.
# Usage (repo root; carry .whl and a cache with the kv_append kernels): TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_bench \
#   OUT=$OUT bash profiling/device/run_gpu_checks_kv_append_slots.sh      -> $OUT/kv_append_slots.tar
set -uo pipefail
OUT=${OUT:-runs/kv_append_slots}
BUDGET=${BUDGET:-200}
DIR="$OUT/kv_append_slots"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv >> "$DIR/setup.log" 2>&1
timeout 150 python3 profiling/bench_attention.py --append-only --append-variants b2_cta128 \
  --append-slots random,contiguous --out "$DIR/kv_append_slots_h200.json" > "$DIR/bench.log" 2>&1
echo "bench exit $?"; grep -E "copy|kv_append" "$DIR/bench.log" | tail -20
