#!/usr/bin/env bash
# A record: it names memory-kernel variants removed on 2026-12-05 (refit_weights v1, v3-v7, v10, v11; quantize v1,
# v4; guided_fake_quantize v1-v6 as variants), so it runs as written only on commit 32f5e89 or earlier.
# Issue 3: refit_weights v6 (refit_weights_v6.cuh: one DRAM read, a shared-memory pipeline per warp) on the H200, one
# call: the refit GPU tests (every variant small, v2 and v6 on the 805 MB layer; forced v6 plans; the v2 fallback),
# refit_weights_packed_'s tests (its amax pass is v2's, whose block quantization moved into refit_quantize_block),
# compute-sanitizer memcheck and racecheck on v6's tests, bench_memory_kernels.py refit v2 / v6 (at each of V6_THREADS
# threads per CTA) at 16 MB .. 1 GB with the copy in the same run, and Nsight Compute on v6 at 256 MB (NCU_THREADS
# threads per CTA).
# ROUNDS (default 2) bench rounds; NCU=0 skips Nsight Compute, PACKED=0 refit_weights_packed_'s tests; TEST_FILTER
# replaces the refit tests' -k expression; ENGINE=1 adds the rollout engine's GPU tests (its refit is
# refit_weights_packed_) while more than 150 s are left, before Nsight Compute.
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_refit_v6.sh -> $OUT/refit_v6.tar
set -uo pipefail
OUT=${OUT:-runs/refit_v6}
BUDGET=${BUDGET:-560}
DIR="$OUT/refit_v6"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
gpu_tests 200 "$DIR/refit_tests.log" tests/gpu/test_quantize_kernels.py \
  -k "${TEST_FILTER:-refit and not (large and (v1 or v3 or v4 or v5))}"
[ "${PACKED:-1}" = 1 ] && gpu_tests 90 "$DIR/refit_packed_tests.log" tests/gpu/test_refit_packed.py
V6_TESTS=(tests/gpu/test_quantize_kernels.py -k "refit and v6 and not large")
sanitize memcheck 80 "$DIR/memcheck.log" python3 -m pytest -q -p no:cacheprovider "${V6_TESTS[@]}"
sanitize racecheck 80 "$DIR/racecheck.log" python3 -m pytest -q -p no:cacheprovider "${V6_TESTS[@]}"
for round in $(seq 1 "${ROUNDS:-2}"); do
  timeout 150 python3 profiling/bench_memory_kernels.py --select refit_weights:v2,refit_weights:v6 \
    --refit-v6-threads "${V6_THREADS:-384}" --sizes-mb 16,64,256,1024 --copy-study-mb "" --no-host-overhead \
    --out "$DIR/memory_refit_v6_$round.json" > "$DIR/bench_$round.log" 2>&1
  echo "bench $round exit $?"; grep -E "^copy|^refit" "$DIR/bench_$round.log"
done
[ "${ENGINE:-0}" = 1 ] && [ "$(left)" -gt 150 ] && gpu_tests $(( $(left) - 70 )) "$DIR/engine_tests.log" \
  tests/rl/test_engine_gpu.py tests/rl/test_engine_kernels.py
[ "${NCU:-1}" = 1 ] && [ "$(left)" -gt 60 ] && ncu_report "$DIR/ncu_refit_v6" $(( $(left) - 15 )) "refit_weights" \
  python3 profiling/ncu_memory_case.py refit:v6 --mb 256 --v6-threads "${NCU_THREADS:-384}"
