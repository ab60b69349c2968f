#!/usr/bin/env bash
# A record: it names memory-kernel variants removed on 2026-12-05 (refit_weights v1, v3-v7, v10, v11; quantize v1,
# v4; guided_fake_quantize v1-v6 as variants), so it runs as written only on commit 32f5e89 or earlier.
# refit v11 (v8's two launches with v9's shared-out requantize wave, verdicts from per-expert marks and a device-side
# epoch) on the H200 in one short call: the GPU tests of v8-v11 (bit-exact, graph replays on weights that stay, shrink
# and grow, v10 / v11 grids and counters, the NaN test with v11), compute-sanitizer memcheck and racecheck on v11's
# small tests, then ROUNDS (default 1) rounds of bench_memory_kernels.py on refit v8, v9 and v11.
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_refit_v11.sh -> $OUT/refit_v11.tar
set -uo pipefail
OUT=${OUT:-runs/refit_v11}
BUDGET=${BUDGET:-190}
DIR="$OUT/refit_v11"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
timeout 80 python3 profiling/prebuild_memory_kernels.py --jobs 16 nvfp4_refit \
  > "$DIR/build_memory.log" 2>&1
echo "memory build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_memory.log"
gpu_tests 60 "$DIR/refit_gpu_tests.log" -m gpu tests/gpu/test_quantize_kernels.py \
  -k "refit and (v8 or v9 or v10 or v11) and (not guided or (nonfinite and v11))"
SMALL=(tests/gpu/test_quantize_kernels.py -k "refit and v11 and not large and not 4096 and not guided")
for tool in memcheck racecheck; do
  sanitize "$tool" 30 "$DIR/${tool}_refit_v11.log" python3 -m pytest -q -p no:cacheprovider -m gpu "${SMALL[@]}"
done
for round in $(seq 1 "${ROUNDS:-1}"); do
  [ "$(left)" -gt 50 ] || break
  timeout $(( $(left) - 5 )) python3 profiling/bench_memory_kernels.py \
    --select refit_weights:v8,refit_weights:v9,refit_weights:v11 --sizes-mb 64,256,1024 --copy-study-mb "" \
    --no-host-overhead --out "$DIR/memory_refit_v11_$round.json" > "$DIR/bench_$round.log" 2>&1
  echo "bench $round exit $?"; grep -E "^copy |^refit" "$DIR/bench_$round.log"
done
echo "== done ($(left)s left)"
