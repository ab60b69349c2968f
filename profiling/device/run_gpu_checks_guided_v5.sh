#!/usr/bin/env bash
# A record: it names memory-kernel variants removed on 2026-12-05 (refit_weights v1, v3-v7, v10, v11; quantize v1,
# v4; guided_fake_quantize v1-v6 as variants), so it runs as written only on commit 32f5e89 or earlier.
# Issue 3: guided_fake_quantize v5 / v6 (the trainer's compact call in a kernel of its own; v6 also picks
# its last search level and output by prmt tables) on the H200, every step under `timeout` (BUDGET s):
#   1. the memory kernels from the carried JIT cache (a miss compiles, 16 jobs; spills fail the build)
#   2. the guided GPU tests of v4, v5, v6 (bit-exact vs the reference, several passes per CTA, NaN flag)
#   3. profiling/bench_memory_kernels.py: guided v4, v5, v6 in every mode, 64 / 256 / 1024 MB, JSON
#   4. compute-sanitizer memcheck and racecheck on v5's and v6's multi-pass and non-finite tests
# The first run (2026-12-02, 9c0be87) built v5 for every mode; only the compact call gained, so v5 / v6
# now build that call alone (profiling/results/guided_v5_h200.json keeps both runs).
# Usage (repo root; carry .whl and a cache): TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_mem OUT=$OUT \
#   bash profiling/device/run_gpu_checks_guided_v5.sh      -> $OUT/guided_v5.tar
set -uo pipefail
OUT=${OUT:-runs/guided_v5}
BUDGET=${BUDGET:-300}
DIR="$OUT/guided_v5"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
export TRACE_KERNELS_PTXAS_CHECK=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv >> "$DIR/setup.log" 2>&1
git log -1 --format="commit %H %s" >> "$DIR/setup.log" 2>&1

timeout 90 python3 profiling/prebuild_memory_kernels.py --jobs 16 nvfp4_guided_fake_quantize_bf16_v4_d2048 \
  nvfp4_guided_fake_quantize_bf16_v5 nvfp4_guided_fake_quantize_bf16_v6 > "$DIR/build.log" 2>&1
echo "build exit $?"; grep -E "FAILED|_d2048|built" "$DIR/build.log" | cut -c1-160 | tail -8

gpu_tests 100 "$DIR/gpu_tests.log" tests/gpu/test_quantize_kernels.py --maxfail=20 -k "guided and (v4 or v5 or v6)"

timeout 110 python3 profiling/bench_memory_kernels.py --select guided_fake_quantize:v4,guided_fake_quantize:v5,guided_fake_quantize:v6 \
  --sizes-mb 64,256,1024 --copy-study-mb "" --no-host-overhead --out "$DIR/guided_v5_h200.json" > "$DIR/bench.log" 2>&1
echo "bench exit $?"; grep -E "guided|copy" "$DIR/bench.log" | grep -v "full \[v[56]\]\|compact \[v[56]\]" | tail -24

limit=$(( $(left) - 4 )); [ "$limit" -gt 40 ] && limit=40
sanitize memcheck "$limit" "$DIR/sanitizer_memcheck.log" python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_quantize_kernels.py -k "(persistent and guided and (v5 or v6)) or (nonfinite and (v5 or v6))"
limit=$(( $(left) - 2 )); [ "$limit" -gt 40 ] && limit=40
sanitize racecheck "$limit" "$DIR/sanitizer_racecheck.log" python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_quantize_kernels.py -k "persistent and guided and v6"
