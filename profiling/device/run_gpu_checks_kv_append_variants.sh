#!/usr/bin/env bash
# kv_append NVFP4 variants A/B on the H200 (< 6 min): the append GPU tests (every variant bit-exact,
# guidance, non-finite rows), bench_attention --append-only over $VARIANTS (64K and 256K tokens, copy
# bandwidth in the same run), memcheck on the launch-bounded (_mb) variant's tests, then the rollout
# engine's GPU tests (they append through the default variant). Outputs in $OUT/kvv/, packed into
# $OUT/kvv.tar. (At 426f3ba this script ran the persistent "p" variants: kv_append_pipelined_h200.json.)
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_kv_append_variants.sh
set -uo pipefail
OUT=${OUT:-runs/kv_append_variants}
BUDGET=${BUDGET:-400}
VARIANTS=${VARIANTS:-b2,b2_cta128,b2_cta128_mb10,b2_cta128_mb12,b2_mb6,b4_cta128_mb8}
W="$OUT/kvv"
mkdir -p "$W"
source profiling/device/gpu_env.sh "$W/setup.log"
tar_on_exit "$W"

echo "== append GPU tests ($(left)s left)"
gpu_tests 150 "$W/kv_append_tests.log" tests/gpu/test_kv_kernels.py -k append

echo "== bench ($(left)s left)"
timeout 150 python3 profiling/bench_attention.py --append-only --append-variants "$VARIANTS" \
  --out "$W/kv_append_variants_h200.json" > "$W/kv_append_bench.log" 2>&1
echo "bench exit $?"; grep -E "copy|kv_append" "$W/kv_append_bench.log"

echo "== memcheck on the _mb variants ($(left)s left)"
sanitize memcheck 60 "$W/kv_append_memcheck.log" python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kv_kernels.py \
  -k "append and mb"

t=$(( $(left) - 5 ))
if [ "$t" -gt 40 ]; then
  echo "== engine GPU tests (${t}s)"
  gpu_tests "$t" "$W/engine_gpu_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_engine.py -m gpu
fi
echo "== done ($(left)s left)"
