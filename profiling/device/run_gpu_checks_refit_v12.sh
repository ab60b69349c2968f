#!/usr/bin/env bash
# A record of the call that measured refit v12 at commit be1709e (removed in the next commit: about 2x slower than v8
# and v9 on steady weights; docs/toolchain.md, "refit v12"). Runs as written only on that commit.
# refit v12 (v9 without its verdict launch: phase 0 resets each expert's verdict, the requantize wave's warps settle the
# verdicts as they first need them) on the H200 in one call: the GPU tests of v8, v9 and v12 (bit-exact, graph replays
# on weights that stay, shrink and grow, v12's grids from one CTA to more than fit, the NaN test with v12),
# compute-sanitizer memcheck and racecheck on v12's small tests, then ROUNDS (default 2) rounds of
# bench_memory_kernels.py on refit v8, v9 and v12 (steady, mixed and fresh weights).
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_refit_v12.sh -> $OUT/refit_v12.tar
set -uo pipefail
OUT=${OUT:-runs/refit_v12}
BUDGET=${BUDGET:-560}
DIR="$OUT/refit_v12"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
export TRACE_KERNELS_PTXAS_CHECK=1  # a kernel that spills fails its build
gpu_tests 200 "$DIR/refit_gpu_tests.log" -m gpu tests/gpu/test_quantize_kernels.py \
  -k "refit and (v8 or v9 or v12) and (not guided or (nonfinite and v12))"
SMALL=(tests/gpu/test_quantize_kernels.py -k "refit and v12 and not large and not 4096 and not guided")
for tool in memcheck racecheck; do
  sanitize "$tool" 90 "$DIR/${tool}_refit_v12.log" python3 -m pytest -q -p no:cacheprovider -m gpu "${SMALL[@]}"
done
for round in $(seq 1 "${ROUNDS:-2}"); do
  [ "$(left)" -gt 70 ] || { echo "round $round skipped: $(left)s left"; break; }
  timeout $(( $(left) - 5 )) python3 profiling/bench_memory_kernels.py \
    --select refit_weights:v8,refit_weights:v9,refit_weights:v12 --sizes-mb 64,256,1024 \
    --copy-study-mb "" --no-host-overhead --out "$DIR/memory_refit_v12_$round.json" > "$DIR/bench_$round.log" 2>&1
  echo "bench $round exit $?"; grep -E "^copy |^refit" "$DIR/bench_$round.log"
done
echo "== done ($(left)s left)"
