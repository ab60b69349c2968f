#!/usr/bin/env bash
# A record: it names memory-kernel variants removed on 2026-12-05 (refit_weights v1, v3-v7, v10, v11; quantize v1,
# v4; guided_fake_quantize v1-v6 as variants), so it runs as written only on commit 32f5e89 or earlier.
# refit v7 (speculative: the previous refit's scales as a guess) on the H200 in one call: the refit GPU tests of every
# variant (v7 among them: bit-exact, a refit after an RL-like step, non-finite experts, graph replay, 805 MB) and
# refit_weights_packed_'s, compute-sanitizer memcheck and racecheck on v7's tests, then ROUNDS (default 2) rounds of
# bench_memory_kernels.py on refit v2 and v7, fresh and steady weights (an RL step's: every expert's amax kept).
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_refit_v7.sh -> $OUT/refit_v7.tar
set -uo pipefail
OUT=${OUT:-runs/refit_v7}
BUDGET=${BUDGET:-540}
DIR="$OUT/refit_v7"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
timeout 100 python3 profiling/prebuild_memory_kernels.py --jobs 16 nvfp4_refit > "$DIR/build_memory.log" 2>&1
echo "memory build exit $? (${SECONDS}s)"; grep -E "v7|built" "$DIR/build_memory.log" | tail -4
gpu_tests 120 "$DIR/refit_gpu_tests.log" -m gpu tests/gpu/test_quantize_kernels.py -k "refit"
gpu_tests 40 "$DIR/refit_packed_gpu_tests.log" -m gpu tests/gpu/test_refit_packed.py
V7_TESTS=(tests/gpu/test_quantize_kernels.py -k "refit and v7 and not large")
sanitize memcheck 50 "$DIR/memcheck_refit_v7.log" python3 -m pytest -q -p no:cacheprovider -m gpu "${V7_TESTS[@]}"
sanitize racecheck 60 "$DIR/racecheck_refit_v7.log" python3 -m pytest -q -p no:cacheprovider -m gpu "${V7_TESTS[@]}"
for round in $(seq 1 "${ROUNDS:-2}"); do
  [ "$(left)" -gt 50 ] || break
  timeout $(( $(left) - 5 )) python3 profiling/bench_memory_kernels.py --select refit_weights:v2,refit_weights:v7 \
    --sizes-mb 16,64,256,1024 --copy-study-mb "" --no-host-overhead --out "$DIR/memory_refit_v7_$round.json" \
    > "$DIR/bench_$round.log" 2>&1
  echo "bench $round exit $?"; grep -E "^copy|^refit" "$DIR/bench_$round.log"
done
