#!/usr/bin/env bash
# The down GEMM's combine in its epilogue (fused_combine) on the prefill tile, on the H200, in one call (BUDGET s).
# auto_cb (auto with fused_combine on its v1 down tiles) was measured at T=8..512 only (fourteenth session, not adopted:
# +0.3-7% from T=32). Since the thirty-sixth session auto's prefill down tile is v1's TN=128 ring, so auto_cb also
# folds the 0.27 ms moe_combine launch at 30B T=16384 (10% of the layer; it reads back the 1.07 GB of FP32 slot rows)
# into the down GEMM, whose DRAM is ~32% busy there (Nsight Compute, thirty-seventh session).
#   1. the layer, auto against auto_cb, two rounds in one process each, arms swapped in the second, at
#      T=1024 / 2048 / 4096 / 16384
#   2. the MoE GPU tests' combine test (the new extra tile: auto's prefill down tile combining, bitwise against the
#      combine kernel, counters left zero), then the whole MoE GPU test file
#   3. memcheck and racecheck on the tiny layer over every tiling (moe_sanitizers), then memcheck on the combine test at
#      30B T=8 (every combining tile; a 30B racecheck does not finish in 400 s: thirty-seventh session)
# Usage (repo root; carry .whl, .tkcache_moe): OUT=$OUT [BUDGET=560] bash profiling/device/run_gpu_checks_combine_prefill_ab.sh
#   .tkcache_moe: python profiling/prebuild_device_caches.py --cache .tkcache_moe moe_tests, then
#   TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_moe python profiling/moe_prebuild.py --tables auto,auto_cb --no-extras qwen3-235b-a22b
#   -> $OUT/combine_prefill_ab.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call combine_prefill_ab 560

moe_layer_ab "$DIR" auto,auto_cb 1024,2048,4096,16384 70
limit=$(( $(left) - 5 )); [ "$limit" -gt 120 ] && limit=120
[ "$limit" -gt 20 ] && sanitize memcheck "$limit" "$DIR/memcheck_fused_combine_t8.log" python3 -m pytest -q \
  -p no:cacheprovider tests/gpu/test_moe_gemm.py -k "test_fused_combine_equals_the_combine_kernel and 8"
echo "== done ($(left)s left)"
