#!/usr/bin/env bash
# The whole GPU suite at HEAD in one call: every GPU test file (run_gpu_checks_full_suite.sh's list), compute-sanitizer
# memcheck and racecheck on the kernel tests that capture CUDA graphs through trace_kernels.runtime.capture_graph,
# bench_moe_gemm.py on one point (its graphs capture through the same helper), and bench_attention.py --extend-only
# (kv_gather, extend_attention, and SDPA with a per-sequence boolean vs additive mask: trace_rl's AttentionMask).
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_suite_and_mask.sh
#   -> $OUT/suite_mask.tar
set -uo pipefail
OUT=${OUT:-runs/suite_mask}
BUDGET=${BUDGET:-575}
DIR="$OUT/suite_mask"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
timeout 150 python3 profiling/prebuild_memory_kernels.py --jobs 16 > "$DIR/build_memory.log" 2>&1
echo "memory build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_memory.log"
moe_build 60 "$DIR/build_moe.log" tiny qwen3-30b-a3b
prebuild_engine_test_models 60 "$DIR/build_engine.log"; echo "engine build exit $? (${SECONDS}s)"
for file in tests/gpu/test_quantize_kernels.py tests/gpu/test_refit_packed.py tests/gpu/test_moe_gemm.py \
            tests/gpu/test_kv_kernels.py tests/gpu/test_sampling_kernel.py tests/test_nvfp4_properties.py tests/rl; do
  [ "$(left)" -gt 120 ] || { echo "skipped $file: $(left) s left"; continue; }
  gpu_tests $(( $(left) - 110 )) "$DIR/$(basename "$file" .py).log" -m gpu "$file"
done
GRAPH_TESTS=(tests/gpu -k "(graph_replay or cuda_graph) and not large")
for tool in memcheck racecheck; do
  [ "$(left)" -gt 80 ] && sanitize "$tool" 45 "$DIR/${tool}_graph_tests.log" python3 -m pytest -q -p no:cacheprovider \
    -m gpu "${GRAPH_TESTS[@]}"
done
[ "$(left)" -gt 60 ] && { timeout 40 python3 profiling/bench_moe_gemm.py --shapes qwen3-30b-a3b --tokens 64 --reps 5 --variants auto \
  --out "$DIR/moe_gemm_smoke.json" > "$DIR/bench_moe.log" 2>&1; echo "bench_moe exit $?"; tail -3 "$DIR/bench_moe.log"; }
[ "$(left)" -gt 30 ] && { timeout $(( $(left) - 5 )) python3 profiling/bench_attention.py --extend-only \
  --out "$DIR/attention_extend_mask_h200.json" > "$DIR/bench_extend.log" 2>&1; echo "bench_extend exit $?";
  grep -E "^extend|^kv_gather" "$DIR/bench_extend.log" | tail -4; }
