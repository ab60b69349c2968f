#!/usr/bin/env bash
# Every GPU test of the project on the H200 in one call (pytest -m gpu, file by file), then compute-sanitizer memcheck
# and racecheck on refit v6's tests at its default thread count and one bench_memory_kernels.py round of refit v2 / v6
# (V6_THREADS, default "384,512").
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/run_gpu_checks_full_suite.sh -> $OUT/full_suite.tar
set -uo pipefail
OUT=${OUT:-runs/full_suite}
BUDGET=${BUDGET:-560}
DIR="$OUT/full_suite"
mkdir -p "$DIR"
source profiling/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
for file in tests/gpu/test_quantize_kernels.py tests/gpu/test_refit_packed.py tests/gpu/test_moe_gemm.py \
            tests/gpu/test_kv_kernels.py tests/gpu/test_sampling_kernel.py tests/test_nvfp4_properties.py; do
  [ "$(left)" -gt 120 ] || { echo "skipped $file: $(left) s left"; continue; }
  gpu_tests $(( $(left) - 110 )) "$DIR/$(basename "$file" .py).log" -m gpu "$file"
done
[ "$(left)" -gt 110 ] && gpu_tests $(( $(left) - 100 )) "$DIR/rl_gpu.log" -m gpu tests/rl
V6_TESTS=(tests/gpu/test_quantize_kernels.py -k "refit and v6 and not large")
sanitize memcheck 40 "$DIR/memcheck_refit_v6.log" python3 -m pytest -q -p no:cacheprovider "${V6_TESTS[@]}"
sanitize racecheck 60 "$DIR/racecheck_refit_v6.log" python3 -m pytest -q -p no:cacheprovider "${V6_TESTS[@]}"
[ "$(left)" -gt 30 ] && timeout $(( $(left) - 5 )) python3 profiling/bench_memory_kernels.py \
  --select refit_weights:v2,refit_weights:v6 --refit-v6-threads "${V6_THREADS:-384,512}" --sizes-mb 16,64,256,1024 \
  --copy-study-mb "" --no-host-overhead --out "$DIR/memory_refit_v6.json" > "$DIR/bench.log" 2>&1
grep -E "^copy|^refit" "$DIR/bench.log"
