#!/usr/bin/env bash
# A record: it names memory-kernel variants removed on 2026-12-05 (refit_weights v1, v3-v7, v10, v11; quantize v1,
# v4; guided_fake_quantize v1-v6 as variants), so it runs as written only on commit 32f5e89 or earlier.
# Issue 3: quantize v4 with 2 bulk-copy stages per warp (3 CTAs = 24 warps per SM, as v2) against v2,
# run 2026-11-30 with V4_STAGES = 2 in python/trace_kernels/codegen/ops/quantize.py (committed: 3):
# the v4 GPU tests and bench_memory_kernels.py at 64 / 256 MB (< 3 min). Outputs in $OUT/s2/, tarred to $OUT/s2.tar.
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_quantize_v4_stages.sh
set -uo pipefail
W="$OUT/s2"; mkdir -p "$W"; trap 'tar -cf "$OUT/s2.tar" -C "$W" .' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
timeout 100 python3 -m pytest tests/gpu/test_quantize_kernels.py -k "quantize and v4 and not guided and not refit" -q -p no:cacheprovider > "$W/tests.log" 2>&1; echo "tests $?"; tail -1 "$W/tests.log"
timeout 80 python3 profiling/bench_memory_kernels.py --select quantize:v2,quantize:v4 --sizes-mb 64,256 --copy-study-mb "" --no-host-overhead --out "$W/memory_quantize_v4_stages2_h200.json" > "$W/bench.log" 2>&1; echo "bench $?"; grep -E "copy|quantize" "$W/bench.log"
