#!/usr/bin/env bash
# A record of the call that measured these launches at commit d0249ca (reverted in the next commit: no gain;
# docs/toolchain.md, "Programmatic dependent launches for quantize and refit"). Runs as written only on that commit.
# The quantize op and refit v8 / v9's phase 0 as programmatic dependent launches (ops.quantize.QUANTIZE_PDL,
# ops.refit_weights.SPECULATIVE_PDL; twenty-fourth session, 2026-12-04) on the H200, one call:
#   1. the quantize and refit v8 / v9 GPU tests (bit-exact, graph replays; both knobs off too)
#   2. compute-sanitizer memcheck and racecheck on small quantize and refit v9 tests
#   3. ROUNDS (default 2) rounds of bench_memory_kernels.py on quantize v2 and refit v8 / v9 at 64 / 256 / 1024 MB, on
#      the base tree (BASE: a copy of the previous commit) and on this one, the order of the trees swapped every round
#   4. the RL layer's GPU tests, time allowing
# Usage (repo root; carry .whl, .tkcache, .ab_base): OUT=$OUT bash profiling/device/run_gpu_checks_memory_pdl.sh
#   -> $OUT/memory_pdl.tar
set -uo pipefail
OUT=${OUT:-runs/memory_pdl}
BUDGET=${BUDGET:-570}
BASE=${BASE:-.ab_base}
DIR="$OUT/memory_pdl"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"

gpu_tests 170 "$DIR/memory_gpu_tests.log" -m gpu tests/gpu/test_quantize_kernels.py \
  -k "test_quantize or nonfinite_flag_quantize or ((refit or first_launch) and (v8 or v9) and not guided) or bad_inputs"
SMALL=(tests/gpu/test_quantize_kernels.py -k "(test_quantize_bitexact and v2 and (16 or 2048)) or (refit and v9 and not large and not 4096 and not guided)")
for tool in memcheck racecheck; do
  sanitize "$tool" 60 "$DIR/${tool}_memory_pdl.log" python3 -m pytest -q -p no:cacheprovider -m gpu "${SMALL[@]}"
done

bench() {  # tree round
  if [ "$1" = base ]; then py=$PWD/$BASE/python; script=$BASE/profiling/bench_memory_kernels.py
  else py=$PWD/python; script=profiling/bench_memory_kernels.py; fi
  PYTHONPATH=/tmp/site:$py:$PWD/rl timeout 80 python3 "$script" \
    --select quantize:v2,refit_weights:v8,refit_weights:v9 --sizes-mb 64,256,1024 --copy-study-mb "" \
    --no-host-overhead --out "$DIR/memory_$1_$2.json" > "$DIR/bench_$1_$2.log" 2>&1
  echo "bench $1 $2 exit $?"; grep -E "^copy |^quantize|^refit" "$DIR/bench_$1_$2.log" | grep -v fresh | tr -s " "
}
for round in $(seq 1 "${ROUNDS:-2}"); do
  [ "$(left)" -gt 180 ] || { echo "round $round skipped: $(left)s left"; break; }
  if [ $(( round % 2 )) = 1 ]; then bench base "$round"; bench new "$round"; else bench new "$round"; bench base "$round"; fi
done
if [ "$(left)" -gt 100 ]; then
  prebuild_engine_test_models 60 "$DIR/build_engine.log"; echo "engine build exit $? (${SECONDS}s)"
  gpu_tests $(( $(left) - 5 )) "$DIR/rl_gpu_tests.log" -m gpu tests/rl
fi
echo "== done ($(left)s left)"
