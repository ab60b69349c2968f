#!/usr/bin/env bash
# The down GEMM's prefill tile moved from ws TN=128 two m-tiles to v1's TN=128 ring (thirty-sixth session, after a
# same-run tile sweep on an H100): the layer A/B and the checks it still owes, on the H200, in one call (BUDGET s):
#   1. the layer, auto against auto_dws (auto with the ws tile), two rounds in one process each, arms swapped in the
#      second, at T=2048 / 4096 / 16384 (T=1024 and below run the same kernels in both arms: 1024 is the control)
#   2. the MoE GPU tests (the v1 TN=128 down kernel is an extra tile: against the reference and bitwise against every
#      other tiling)
#   3. compute-sanitizer memcheck and racecheck on the tiny fused gate_up and down tests over every tiling
#      (moe_sanitizers), then racecheck on the Qwen3-30B-A3B gate_up / down tests at T=300 (the kernels the torch ops
#      test runs at that T)
# Usage (repo root; carry .whl, .tkcache_moe): OUT=$OUT [BUDGET=560] bash profiling/device/run_gpu_checks_down_prefill_ab.sh
#   .tkcache_moe: python profiling/prebuild_device_caches.py --cache .tkcache_moe moe_tests
#   -> $OUT/down_prefill_ab.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call down_prefill_ab 560

moe_layer_ab "$DIR" auto,auto_dws 1024,2048,4096,16384 130
limit=$(( $(left) - 5 )); [ "$limit" -gt 150 ] && limit=150
[ "$limit" -gt 30 ] && sanitize racecheck "$limit" "$DIR/racecheck_30b_t300.log" python3 -m pytest -q \
  -p no:cacheprovider tests/gpu/test_moe_gemm.py \
  -k "(test_gate_up_fused_quantization_is_exact or test_down_combine_matches_reference) and qwen3-30b-a3b-300"
echo "== done ($(left)s left)"
