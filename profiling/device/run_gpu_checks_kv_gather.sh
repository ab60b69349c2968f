#!/usr/bin/env bash
# Issue 5, one H200 call (every step under `timeout`, BUDGET s): kv_gather, the paged NVFP4 K/V -> contiguous
# dequantized K/V kernel behind extend_attention and the rollout engine's prefill attention.
#   (1) the KV GPU tests (kv_gather bit for bit against its reference in every output dtype and blocks-per-thread
#       choice, CUDA graph, bad input; extend_attention on it against the torch gather; kv_append and decode, whose
#       page-pointer struct moved to kv_pages.cuh)
#   (2) the rollout engine's GPU tests (its prefill steps gather through the kernel)
#   (3) memcheck / racecheck on the kv_gather tests but the long case
#   (4) bench_attention.py --extend-only, twice: kv_gather's bandwidth against the copy measured in the same run,
#       extend_attention with kv_gather against the torch gather it replaced and SDPA over a contiguous BF16 cache
#   (5) extend_breakdown.py: extend_attention against SDPA with the mask and layout variants in between
# Usage (repo root; carry .whl and .tkcache, built here by kv_testing.kernel_specs and prebuild_engine_kernels.py):
#   OUT=$OUT bash profiling/device/run_gpu_checks_kv_gather.sh -> $OUT/kv_gather.tar
set -uo pipefail
OUT=${OUT:-runs/kv_gather}
BUDGET=${BUDGET:-560}
DIR="$OUT/kv_gather"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
timeout 120 python3 -c "from trace_kernels import kv_testing; print(*kv_testing.build_report(16), sep='\n')" \
  > "$DIR/build_kv.log" 2>&1
echo "kv build exit $? (${SECONDS}s)"; grep -c "registers" "$DIR/build_kv.log"; grep -i "failed" "$DIR/build_kv.log" | head -3
prebuild_engine_test_models 100 "$DIR/build_engine.log"; echo "engine build (${SECONDS}s)"; tail -1 "$DIR/build_engine.log"
gpu_tests 150 "$DIR/kv_tests.log" tests/gpu/test_kv_kernels.py
gpu_tests 120 "$DIR/engine_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_guidance_capture.py \
  tests/rl/test_engine_kernels.py
for round in 1 2; do
  timeout 70 python3 profiling/bench_attention.py --extend-only --out "$DIR/kv_gather_$round.json" \
    > "$DIR/bench_$round.log" 2>&1
  echo "bench $round exit $? (${SECONDS}s)"; grep -E "^kv_gather|^extend" "$DIR/bench_$round.log" | cut -c1-150
done
timeout 90 python3 profiling/extend_breakdown.py --out "$DIR/extend_breakdown.json" > "$DIR/extend_breakdown.log" 2>&1
echo "breakdown exit $? (${SECONDS}s)"; grep -E " ms$" "$DIR/extend_breakdown.log"
grep -A 16 "^extend_attention (3 calls)" "$DIR/extend_breakdown.log" | cut -c1-150
limit=$(( ($(left) - 5) / 2 )); [ "$limit" -gt 90 ] && limit=90
sanitize memcheck "$limit" "$DIR/sanitizer_memcheck.log" python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_kv_kernels.py -k "kv_gather and not long"
sanitize racecheck "$limit" "$DIR/sanitizer_racecheck.log" python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_kv_kernels.py -k "kv_gather and not long"
