#!/usr/bin/env bash
# A record: it names memory-kernel variants removed on 2026-12-05 (refit_weights v1, v3-v7, v10, v11; quantize v1,
# v4; guided_fake_quantize v1-v6 as variants), so it runs as written only on commit 32f5e89 or earlier.
# The project's GPU tests on the H200 in one call (pytest -m gpu, file by file; TEST_FILES picks the files, QUANTIZE_K
# a -k expression for tests/gpu/test_quantize_kernels.py), then compute-sanitizer memcheck and racecheck on refit v6's
# tests at its default thread count, ROUNDS (default 1) bench_memory_kernels.py rounds of refit v2 / v6 at each of
# V6_THREADS (default "384,512") and, with NCU=1, Nsight Compute on v6 at 256 MB (NCU_THREADS, default 384).
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_full_suite.sh -> $OUT/full_suite.tar
set -uo pipefail
OUT=${OUT:-runs/full_suite}
BUDGET=${BUDGET:-560}
DIR="$OUT/full_suite"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
ALL="tests/gpu/test_quantize_kernels.py tests/gpu/test_refit_packed.py tests/gpu/test_moe_gemm.py tests/gpu/test_kv_kernels.py
     tests/gpu/test_sampling_kernel.py tests/test_nvfp4_properties.py tests/rl"
for file in ${TEST_FILES:-$ALL}; do
  [ "$(left)" -gt 150 ] || { echo "skipped $file: $(left) s left"; continue; }
  filter=()
  [ "$file" = tests/gpu/test_quantize_kernels.py ] && [ -n "${QUANTIZE_K:-}" ] && filter=(-k "$QUANTIZE_K")
  gpu_tests $(( $(left) - 140 )) "$DIR/$(basename "$file" .py).log" -m gpu "$file" "${filter[@]}"
done
V6_TESTS=(tests/gpu/test_quantize_kernels.py -k "refit and (v6 or off_the_fast) and not large")
sanitize memcheck 50 "$DIR/memcheck_refit_v6.log" python3 -m pytest -q -p no:cacheprovider "${V6_TESTS[@]}"
sanitize racecheck 70 "$DIR/racecheck_refit_v6.log" python3 -m pytest -q -p no:cacheprovider "${V6_TESTS[@]}"
for round in $(seq 1 "${ROUNDS:-1}"); do
  [ "$(left)" -gt 40 ] || break
  timeout $(( $(left) - 5 )) python3 profiling/bench_memory_kernels.py --select refit_weights:v2,refit_weights:v6 \
    --refit-v6-threads "${V6_THREADS:-384,512}" --sizes-mb 16,64,256,1024 --copy-study-mb "" --no-host-overhead \
    --out "$DIR/memory_refit_v6_$round.json" > "$DIR/bench_$round.log" 2>&1
  echo "bench $round exit $?"; grep -E "^copy|^refit" "$DIR/bench_$round.log"
done
[ "${NCU:-0}" = 1 ] && [ "$(left)" -gt 50 ] && ncu_report "$DIR/ncu_refit_v6" $(( $(left) - 10 )) "refit_weights" \
  python3 profiling/ncu_memory_case.py refit:v6 --mb 256 --v6-threads "${NCU_THREADS:-384}"
