#!/usr/bin/env bash
# The two defaults the thirty-fourth session (2026-12-05) moved after same-call A/Bs on an H100, checked in one call,
# every step under `timeout` (BUDGET s), in this order:
#   1. the MoE GPU tests on the new auto tables (auto's v1 prefill tiles gather whole activation pieces per thread,
#      TileConfig.gather_pieces; "auto_gp0" is auto without it)
#   2. the KV GPU tests at GQA 16 / 12 (groups above 8 now run mma4l_w1s2_c16, attention.DEFAULT_NVFP4_WIDE_VARIANT)
#   3. the RL layer's GPU tests (the engine's prefill runs the gathering tile)
#   4. while time is left: the layer auto against auto_gp0 (T=64 runs the same kernels in both arms: the control);
#      bench_attention.py at Qwen3-235B-A22B's heads (64 x 4 x 128), mma4l against mma4l_w1s2_c16, and at issue 5's
#      (32 x 4 x 128, mma4l, unchanged) for the card's standing
# Usage (repo root; carry .whl, .tkcache_moe): OUT=$OUT [BUDGET=570] [BENCH_FIRST=1] bash profiling/device/run_gpu_checks_new_defaults.sh
#   BENCH_FIRST=1: step 4 before steps 1-3 (for a short call on a card whose numbers are owed, after the tests
#   have passed on another; the builds still come first)
#   .tkcache_moe: python profiling/prebuild_device_caches.py --cache .tkcache_moe moe_tests kv wide engine
#   -> $OUT/new_defaults.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call new_defaults 570

moe_build_ab "$DIR" auto,auto_gp0
bench() {  # bench NAME HEADS VARIANTS LIMIT
  timeout "$4" python3 profiling/bench_attention.py --decode-only --heads "$2" --nvfp4-variants "$3" \
    --bf16-variants mma --out "$DIR/attention_$1.json" > "$DIR/attention_$1.log" 2>&1
  echo "attention $1 $2 exit $? (${SECONDS}s)"
  grep -iE "\| +(nvfp4|sdpa)" "$DIR/attention_$1.log" | cut -c1-110 | head -16
}
capped() {  # capped LIMIT: LIMIT, or the budget left less 10 s when that is smaller (0: no time for the step)
  local l=$(( $(left) - 10 )); [ "$l" -lt 0 ] && l=0; [ "$1" -lt "$l" ] && echo "$1" || echo "$l"
}
run_tests() {
  [ "$(capped 150)" -gt 30 ] && gpu_tests "$(capped 150)" "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
  [ "$(capped 90)" -gt 30 ] && gpu_tests "$(capped 90)" "$DIR/kv_tests.log" -m gpu tests/gpu/test_kv_kernels.py \
    -k "wide or c16 or 64-4-128 or 24-2-64"
  [ "$(capped 100)" -gt 30 ] && gpu_tests "$(capped 100)" "$DIR/rl_gpu_tests.log" -m gpu tests/rl
}
run_benches() {
  # (each step while the call's BUDGET leaves room for it: a call may be lent less than 10 minutes)
  [ "$(left)" -gt 120 ] && layer_ab_round "$DIR" 1 110 --variants auto,auto_gp0 --tokens 64,4096,16384
  [ "$(left)" -gt 110 ] && bench gqa16 64x4x128x16 mma4l,mma4l_w1s2_c16 100
  [ "$(left)" -gt 90 ] && bench gqa8 32x4x128x16 mma4l 80
}
if [ "${BENCH_FIRST:-0}" = 1 ]; then run_benches; run_tests; else run_tests; run_benches; fi
echo "== done ($(left)s left)"
