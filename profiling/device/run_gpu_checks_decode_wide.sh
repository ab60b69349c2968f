#!/usr/bin/env bash
# Decode at GQA groups above 8 (thirty-second session, 2026-12-05, written without a device; not yet run): mma4l_c16
# takes a group of 9-16 q heads per kv head in one CTA (two MMA column blocks sharing each dequantized K / V fragment),
# where mma4l takes it in two CTAs that each read and dequantize every K/V byte (GLM-4.5's 96 x 8 heads ran at 53-55% of
# copy on an H100, docs/kv_cache.md). One call, every step under `timeout` (BUDGET s):
#   1. the wide variants' GPU tests (WIDE_TEST_VARIANTS x WIDE_CASES, split counts planned / 1 / 3; growing scores and
#      special rows; bytes past the end) and the GQA 16 / 12 cases of every other decode test
#   2. memcheck, then racecheck, on the wide variants' GQA 16 and GQA 12 cases
#   3. bench_attention.py --decode-only at Qwen3-235B-A22B's heads (64 x 4 x 128, GQA 16): mma4l against the three
#      wide configurations, BF16 mma, SDPA, the copy; then at GLM-4.5's (96 x 8 x 128, GQA 12): mma4l, mma4l_c16,
#      mma4l_w1s2_c16. A second round of the first if time is left.
# The kernels are prebuilt here into .tkcache (prebuild_device_caches.py's kv and wide sets).
# Usage (repo root; carry .whl, .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_decode_wide.sh
#   .tkcache: python profiling/prebuild_device_caches.py kv wide
#   -> $OUT/decode_wide.tar
set -uo pipefail
OUT=${OUT:-runs/decode_wide}
BUDGET=${BUDGET:-570}
DIR="$OUT/decode_wide"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"

gpu_tests 200 "$DIR/wide_tests.log" -m gpu tests/gpu/test_kv_kernels.py -k "wide or c16 or 64-4-128 or 24-2-64"
# memcheck: the three wide configurations at GQA 16 and GQA 12 (D 128); racecheck (slower): the default's two
wide="test_wide_variant_matches_reference and (lengths0 or lengths1) and None"
sanitize memcheck 70 "$DIR/wide_memcheck.log" python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/gpu/test_kv_kernels.py -k "$wide"
sanitize racecheck 90 "$DIR/wide_racecheck.log" python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/gpu/test_kv_kernels.py -k "$wide and mma4l_c16-"

bench() {  # bench ROUND HEADS VARIANTS LIMIT
  timeout "$4" python3 profiling/bench_attention.py --decode-only --heads "$2" --nvfp4-variants "$3" \
    --bf16-variants mma --out "$DIR/attention_wide_${2%%x*}_$1.json" > "$DIR/attention_wide_${2%%x*}_$1.log" 2>&1
  echo "attention $2 round $1 exit $? (${SECONDS}s)"
  grep -iE "\| +(nvfp4|bf16|sdpa)" "$DIR/attention_wide_${2%%x*}_$1.log" | head -24
}
bench 1 64x4x128x16 mma4l,mma4l_c16,mma4l_w1s4_c16,mma4l_w1s2_c16 150
bench 1 96x8x128x16 mma4l,mma4l_c16,mma4l_w1s2_c16 110
[ "$(left)" -gt 140 ] && bench 2 64x4x128x16 mma4l_c16,mma4l,mma4l_w1s4_c16,mma4l_w1s2_c16 $(( $(left) - 10 ))
echo "== done ($(left)s left)"
