#!/usr/bin/env bash
# The lazy decode test on each lane's own maxima (fifty-first session, 2026-12-06), one call (BUDGET s):
# mma4l's tile loop (attention_decode_mma2.cuh, kLean) no longer reduces the score maxima over a column's 8 lanes
# before deciding whether to rescale; only a tile that rescales does (12 shuffles and 12 max fewer per common tile at
# one column block, 24 at two; the common path's SASS 728 -> 702 instructions at Hq 32 / Hkv 4 / D 128 / P 16).
#   1. decode_ab.py, BASE's headers (the tree before) against this tree's, outputs compared bit for bit, ROUNDS rounds:
#      issue 5's heads (mma4l, 32 x 4 x 128), then GQA 16 (64 x 4 x 128) with mma4l, whose two CTAs per kv head make
#      the loop bound by the SMs on an H100 too (the H100 and H200 times there are equal: docs/kv_cache.md), the proxy
#      an H100 has for the H200's issue-bound loop, then GQA 16's default (mma4l_w1s2_c16, two column blocks)
#   2. the KV GPU tests, then memcheck and racecheck on the decode tests (gpu_env.sh's decode_sanitizers)
# Usage (repo root; carry .whl, .tkcache_moe, .ab_base):
#   OUT=$OUT [BUDGET=480] [ROUNDS=2] [TESTS=0] bash profiling/device/run_gpu_checks_decode_lazy_max.sh
#   (TESTS=0 skips step 2: the A/Bs alone, e.g. on an H200 after the checks passed on an H100 with the same kernels,
#    as they did in the fifty-first session: profiling/results/attention_decode_lazy_max_h100_checks.log)
#   .tkcache_moe: python profiling/prebuild_device_caches.py --cache .tkcache_moe moe_tests engine kv
#   .ab_base: rm -rf .ab_base && mkdir .ab_base && git archive <commit before> cuda | tar -x -C .ab_base
#   -> $OUT/decode_lazy_max.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call decode_lazy_max 480
BASE=${BASE:-.ab_base}

arms=(--arm "base=$BASE/cuda/include" --arm new=cuda/include)  # BASE against this tree
decode_ab decode_lazy_max_gqa8 100 "${arms[@]}"
decode_ab decode_lazy_max_gqa16_mma4l 100 "${arms[@]}" --heads 64x4x128x16 --variant mma4l
decode_ab decode_lazy_max_gqa16_c16 100 "${arms[@]}" --heads 64x4x128x16

if [ "${TESTS:-1}" = 1 ]; then
  limit=$(( $(left) - 60 )); [ "$limit" -gt 90 ] && limit=90
  [ "$limit" -gt 20 ] && gpu_tests "$limit" "$DIR/kv_gpu_tests.log" -m gpu tests/gpu/test_kv_kernels.py
  [ "$(left)" -gt 30 ] && decode_sanitizers "$DIR"
fi
for tool in memcheck racecheck; do
  [ -f "$DIR/sanitizer_$tool.log" ] || continue
  echo "$tool:"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$DIR/sanitizer_$tool.log" | tail -2
done
echo "== done ($(left)s left)"
