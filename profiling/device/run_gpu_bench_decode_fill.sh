#!/usr/bin/env bash
# Issue 5's benchmark with the current default NVFP4 decode kernel only (fiftieth session): the four decode cases and
# the batch at 128K whose NVFP4 cache fills the card, with SDPA over a contiguous BF16 cache, the BF16 pages and the
# copy in the same run, then kv_append and extend_attention (bench_attention.py without --quick / --decode-only). The
# memory-filling batch had last run on 2026-11-29's first kernel (attention_h200.json: 250 x 128K, 1.25 TB/s).
# FILL_GB (default: about 30% of the card's memory; the benchmark keeps two cache sets of it) sizes that batch.
# Usage (repo root; carry .whl, .tkcache: python profiling/prebuild_device_caches.py --cache .tkcache kv):
#   OUT=$OUT [BUDGET=300] [FILL_GB=...] [REQUIRE_GPU=H200] bash profiling/device/run_gpu_bench_decode_fill.sh
#   -> $OUT/decode_fill.tar (attention_decode_fill_<card>.json, bench.log, machine.log)
set -uo pipefail
source profiling/device/gpu_env.sh --call decode_fill 300 .tkcache
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o 'H[0-9]00' || echo gpu)
total_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
FILL_GB=${FILL_GB:-$(( total_mib * 3 / 10 / 1024 ))}
echo "card $card, fill ${FILL_GB} GB per cache set"
timeout $(( $(left) - 10 )) python3 profiling/bench_attention.py --nvfp4-variants mma4l --fill-gb "$FILL_GB" \
  --out "$DIR/attention_decode_fill_$(echo "$card" | tr 'A-Z' 'a-z').json" > "$DIR/bench.log" 2>&1
echo "bench exit $? (${SECONDS}s)"
tail -25 "$DIR/bench.log"
