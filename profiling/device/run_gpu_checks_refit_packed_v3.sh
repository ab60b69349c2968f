#!/usr/bin/env bash
# A record of the call that measured refit_weights_packed_ v3 at commit 09563da (the variant was removed in the next
# commit: it lost to v2; docs/toolchain.md, "refit_weights_packed_ v3"). Runs as written only on that commit.
# refit_weights_packed_ v3 (v2's three launches on half-record units: 4 CTAs of 4 warps per SM instead of 3) on the
# H200: the packed op's GPU tests of every variant, compute-sanitizer memcheck and racecheck on v3's small tests,
# ROUNDS (default 1) rounds of bench_moe_pack.py --what refit on the base tree's v2 (BASE: a copy of the commit before
# v3) and this tree's v2 and v3 (the order of the trees swapped every round), then the RL layer's GPU tests with the
# engine's weight sync on v3, time allowing.
# Usage (repo root; carry .whl, .tkcache, .ab_base): OUT=$OUT bash profiling/device/run_gpu_checks_refit_packed_v3.sh
#   -> $OUT/refit_packed_v3.tar   (STEPS: comma list of tests, sanitize, bench, rl; default all; FIRST_ROUND numbers
#   the rounds, so a second call's round 2 starts with this tree)
set -uo pipefail
OUT=${OUT:-runs/refit_packed_v3}
BUDGET=${BUDGET:-570}
BASE=${BASE:-.ab_base}
STEPS=${STEPS:-tests,sanitize,bench,rl}
DIR="$OUT/refit_packed_v3"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
step() { [[ ",$STEPS," == *",$1,"* ]]; }

if step tests; then
  gpu_tests 200 "$DIR/refit_packed_gpu_tests.log" -m gpu tests/gpu/test_refit_packed.py --durations=5
fi
if step sanitize; then
  SMALL=(tests/gpu/test_refit_packed.py -k "v3 and not 1536 and not 2048")
  for tool in memcheck racecheck; do
    sanitize "$tool" 120 "$DIR/${tool}_refit_packed_v3.log" python3 -m pytest -q -p no:cacheprovider -m gpu \
      "${SMALL[@]}"
  done
fi

bench_base() {  # round: the base tree's bench (v1, v2)
  PYTHONPATH=/tmp/site:$PWD/$BASE/python timeout 150 python3 "$BASE/profiling/bench_moe_pack.py" --what refit \
    --reps 20 --out "$DIR/refit_packed_base_$1.json" > "$DIR/bench_base_$1.log" 2>&1
  echo "bench base $1 exit $?"; grep -E "qwen3|v2 fresh" "$DIR/bench_base_$1.log"
}
bench_tree() {  # round: this tree's bench (v1, v2, v3)
  timeout 190 python3 profiling/bench_moe_pack.py --what refit --reps 20 --out "$DIR/refit_packed_v3_$1.json" \
    > "$DIR/bench_tree_$1.log" 2>&1
  echo "bench tree $1 exit $?"; grep -E "qwen3|fresh" "$DIR/bench_tree_$1.log"
}
if step bench; then
  first=${FIRST_ROUND:-1}
  for round in $(seq "$first" $(( first + ${ROUNDS:-1} - 1 ))); do
    [ "$(left)" -gt 200 ] || { echo "round $round skipped: $(left)s left"; break; }
    if [ $(( round % 2 )) = 1 ]; then bench_base "$round"; bench_tree "$round"
    else bench_tree "$round"; bench_base "$round"; fi
  done
fi
if step rl && [ "$(left)" -gt 120 ]; then
  prebuild_engine_test_models 60 "$DIR/build_engine.log"; echo "engine build exit $? (${SECONDS}s)"
  TRACE_KERNELS_REFIT_PACKED_VARIANT=v3 gpu_tests $(( $(left) - 5 )) "$DIR/rl_gpu_tests_v3.log" -m gpu tests/rl
fi
echo "== done ($(left)s left)"
