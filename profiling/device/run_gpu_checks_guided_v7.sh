#!/usr/bin/env bash
# A record: it names memory-kernel variants removed on 2026-12-05 (refit_weights v1, v3-v7, v10, v11; quantize v1,
# v4; guided_fake_quantize v1-v6 as variants), so it runs as written only on commit 32f5e89 or earlier.
# Ninth session of 2026-12-02 on the H200, one call, every step under `timeout` (BUDGET s):
#   1. build: the memory kernels (guided v7 among them) and the KV kernels of the tests (mma4l at every test
#      shape), 8 nvcc jobs each, in parallel; spills fail the build (TRACE_KERNELS_PTXAS_CHECK=1)
#   2. the guided GPU tests of v4, v6 and v7 (bit-exact vs the reference, counters, capped grids, non-finite)
#   3. bench_memory_kernels.py: guided v4, v6, v7 in every mode at 64 / 256 / 1024 MB against the copy
#   4. the KV GPU tests of mma4l and of the default launch (now mma4l)
#   5. compute-sanitizer memcheck and racecheck on v7's capped-grid and non-finite tests and on mma4l decode
# Usage (repo root; carry .whl): OUT=$OUT bash profiling/device/run_gpu_checks_guided_v7.sh   -> $OUT/guided_v7.tar
set -uo pipefail
OUT=${OUT:-runs/guided_v7}
BUDGET=${BUDGET:-540}
DIR="$OUT/guided_v7"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/setup.log"

TRACE_KERNELS_PTXAS_CHECK=1 timeout 170 python3 profiling/prebuild_memory_kernels.py --jobs 8 \
  nvfp4_guided_fake_quantize_bf16_v7 nvfp4_guided_fake_quantize_bf16_v4_d2048 > "$DIR/build_memory.log" 2>&1 &
TRACE_KERNELS_PTXAS_CHECK=1 timeout 170 python3 profiling/bench_attention.py --build-only 8 --nvfp4-variants mma4l \
  > "$DIR/build_kv.log" 2>&1
echo "kv build exit $? (${SECONDS}s)"; grep -E "FAILED|kernels built" "$DIR/build_kv.log" | grep -v "_mb12_" | tail -3
wait
echo "memory build (${SECONDS}s):"; grep -E "FAILED|_d2048|built" "$DIR/build_memory.log" | grep -v "_mb12_" | cut -c1-150 | tail -8

gpu_tests 120 "$DIR/guided_tests.log" tests/gpu/test_quantize_kernels.py --maxfail=20 -k "guided and (v4 or v6 or v7)"

timeout 130 python3 profiling/bench_memory_kernels.py \
  --select guided_fake_quantize:v4,guided_fake_quantize:v6,guided_fake_quantize:v7 \
  --sizes-mb 64,256,1024 --copy-study-mb "" --no-host-overhead --out "$DIR/guided_v7_h200.json" > "$DIR/bench.log" 2>&1
echo "bench exit $? (${SECONDS}s)"; grep -E "^guided|^copy" "$DIR/bench.log" | sed "s/guided_fake_quantize //" | tr -s " " | cut -c1-80

gpu_tests $(( $(left) > 260 ? 150 : $(left) - 100 )) "$DIR/kv_tests.log" tests/gpu/test_kv_kernels.py -k "mma4l or None"

limit=$(( ($(left) - 6) / 3 )); [ "$limit" -gt 50 ] && limit=50
sanitize memcheck "$limit" "$DIR/sanitizer_memcheck.log" python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_quantize_kernels.py -k "(persistent and guided and v7) or (nonfinite and guided and v7)"
sanitize racecheck "$limit" "$DIR/sanitizer_racecheck.log" python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_quantize_kernels.py -k "persistent and guided and v7"
limit=$(( $(left) - 4 )); [ "$limit" -gt 50 ] && limit=50
sanitize memcheck "$limit" "$DIR/sanitizer_memcheck_kv.log" python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_kv_kernels.py -k "test_decode_ignores_bytes_past_the_end and mma4l"
