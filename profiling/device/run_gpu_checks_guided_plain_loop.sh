#!/usr/bin/env bash
# Tenth session of 2026-12-02 on the H200, one call (every step under `timeout`, BUDGET s): guided v7's compact
# guidance with counters on v3's loop (no software pipelining: 80 instead of 94 registers, so 6 CTAs of 128
# threads per SM, 2 blocks per thread and pass) against v4's loop at 5 x 128 (the default). It ran while the former
# was codegen's V7_GEOMETRY (so steps 1-2 checked it); no geometry won (guided_plain_loop_h200.json):
#   1. build v7's guided kernels of the tests (spills fail the build: TRACE_KERNELS_PTXAS_CHECK=1)
#   2. v7's guided GPU tests; compute-sanitizer memcheck (capped grids, non-finite) and racecheck (capped grids)
#   3. bench_memory_kernels.py, guided v7, 64 / 256 MB: the geometries in turn (--guided-v7-geometry), the first
#      two twice
# Usage (repo root; carry .whl): OUT=$OUT bash profiling/device/run_gpu_checks_guided_plain_loop.sh -> $OUT/guided_plain_loop.tar
set -uo pipefail
OUT=${OUT:-runs/guided_plain_loop}
BUDGET=${BUDGET:-500}
DIR="$OUT/guided_plain_loop"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/setup.log"

TRACE_KERNELS_PTXAS_CHECK=1 timeout 150 python3 -c "
from trace_kernels import jit
from trace_kernels.testing.kernel_sets import memory_kernel_specs
specs = [s for s in memory_kernel_specs() if '_v7_' in s.name or '_v6_' in s.name]
bad = [s.name for s, e in zip(specs, jit.build_all(specs, jobs=16, keep_going=True)) if isinstance(e, Exception)]
print(len(specs) - len(bad), 'of', len(specs), 'built; failed:', bad)
" > "$DIR/build.log" 2>&1
echo "build exit $? (${SECONDS}s)"; tail -1 "$DIR/build.log"

gpu_tests 60 "$DIR/guided_tests.log" tests/gpu/test_quantize_kernels.py -k "guided and v7"
sanitize memcheck 60 "$DIR/sanitizer_memcheck.log" python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_quantize_kernels.py -k "(persistent and guided and v7) or (nonfinite and guided and v7)"
sanitize racecheck 60 "$DIR/sanitizer_racecheck.log" python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_quantize_kernels.py -k "persistent and guided and v7"

run=0
for geometry in compact_counters=128x6x2 compact_counters=128x5 compact_counters=128x6x1 compact_counters=256x3x2 \
    compact_counters=128x7x2 compact_counters=128x6x2 compact_counters=128x5; do
  run=$((run + 1))
  [ "$(left)" -lt 35 ] && { echo "run $run [$geometry]: skipped"; continue; }
  timeout 35 python3 profiling/bench_memory_kernels.py --select guided_fake_quantize:v7 --sizes-mb 64,256 \
    --copy-study-mb "" --no-host-overhead --guided-v7-geometry "$geometry" --out "$DIR/guided_geometry$run.json" \
    > "$DIR/bench$run.log" 2>&1
  echo "bench $run [$geometry] exit $? (${SECONDS}s)"
  grep -E "^guided.*compact \[|^copy" "$DIR/bench$run.log" | sed "s/guided_fake_quantize //" | tr -s " " | cut -c1-60
done
