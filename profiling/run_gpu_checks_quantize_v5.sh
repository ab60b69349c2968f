#!/usr/bin/env bash
# Issue 3: quantize v5 (v2's rows with the optional outputs fixed per kernel: codes-only 67 registers,
# guidance bits + BF16 operand 72, against v2's 78 for all sets) on the H200, every step under `timeout`:
#   1. the memory kernels from the carried JIT cache (a miss compiles, 16 jobs; spills fail the build)
#   2. the quantize GPU tests of v2 and v5 (every output set bit-exact), the trainer's guided GPU test
#      (tests/rl/test_trainer_quantizers.py, on the default guided v6)
#   3. profiling/bench_memory_kernels.py: quantize v2 / v5 and guided v4 / v6, 64 / 256 / 1024 MB, JSON
#   4. compute-sanitizer memcheck and racecheck on v5's quantize tests (small cases)
# Usage (repo root; carry .whl and a cache): TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_mem OUT=$OUT \
#   bash profiling/run_gpu_checks_quantize_v5.sh      -> $OUT/quantize_v5.tar
set -uo pipefail
OUT=${OUT:-runs/quantize_v5}
BUDGET=${BUDGET:-300}
DIR="$OUT/quantize_v5"
mkdir -p "$DIR"
source profiling/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
export TRACE_KERNELS_PTXAS_CHECK=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv >> "$DIR/setup.log" 2>&1

timeout 90 python3 profiling/prebuild_memory_kernels.py --jobs 16 nvfp4_quantize_bf16_v2_d2048 \
  nvfp4_quantize_bf16_v5_codes_d2048 nvfp4_quantize_bf16_v5_bits_dq_d2048 > "$DIR/build.log" 2>&1
echo "build exit $?"; grep -E "FAILED|_d2048|built" "$DIR/build.log" | cut -c1-160 | tail -8

gpu_tests 100 "$DIR/gpu_tests.log" tests/gpu/test_quantize_kernels.py --maxfail=20 \
  -k "quantize and (v2 or v5) and not guided and not refit"
gpu_tests 60 "$DIR/trainer_gpu_tests.log" tests/rl/test_trainer_quantizers.py -m gpu

timeout 120 python3 profiling/bench_memory_kernels.py \
  --select quantize:v2,quantize:v5,guided_fake_quantize:v4,guided_fake_quantize:v6 \
  --sizes-mb 64,256,1024 --copy-study-mb "" --no-host-overhead --out "$DIR/quantize_v5_h200.json" > "$DIR/bench.log" 2>&1
echo "bench exit $?"; grep -E "quantize|copy" "$DIR/bench.log" | grep -v "full \[v6\]\|compact \[v6\]" | tail -27

SUBSET="(output_sets or optional or persistent or nonfinite) and v5 and not guided and not refit"
limit=$(( $(left) - 4 )); [ "$limit" -gt 40 ] && limit=40
sanitize memcheck "$limit" "$DIR/sanitizer_memcheck.log" python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_quantize_kernels.py -k "$SUBSET"
limit=$(( $(left) - 2 )); [ "$limit" -gt 40 ] && limit=40
sanitize racecheck "$limit" "$DIR/sanitizer_racecheck.log" python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_quantize_kernels.py -k "output_sets and v5 and bfloat16"
