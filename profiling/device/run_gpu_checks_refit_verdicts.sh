#!/usr/bin/env bash
# A record: it names memory-kernel variants removed on 2026-12-05 (refit_weights v1, v3-v7, v10, v11; quantize v1,
# v4; guided_fake_quantize v1-v6 as variants), so it runs as written only on commit 32f5e89 or earlier.
# The speculative refits' verdicts with batched loads (thread_amax_of_words: refit v8 / v9 / v10 and
# refit_weights_packed_ v2) and packed v2's phase 1 reusing its record's block amaxes, on the H200 in one call:
# the refit GPU tests of every variant and the packed op's of both, compute-sanitizer memcheck and racecheck on v9's,
# v10's and packed v2's small tests, ROUNDS (default 2) rounds of bench_memory_kernels.py on refit v2, v9 and v10
# (fresh, steady and mixed weights), bench_moe_pack.py --what refit (packed v1 against v2), then the RL layer's GPU
# tests (the engine's sync is packed v2), time allowing.
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_refit_verdicts.sh
#   -> $OUT/refit_verdicts.tar
set -uo pipefail
OUT=${OUT:-runs/refit_verdicts}
BUDGET=${BUDGET:-570}
DIR="$OUT/refit_verdicts"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
timeout 100 python3 profiling/prebuild_memory_kernels.py --jobs 16 nvfp4_refit nvfp4_quantize nvfp4_guided \
  > "$DIR/build_memory.log" 2>&1
echo "memory build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_memory.log"
gpu_tests 120 "$DIR/refit_gpu_tests.log" -m gpu tests/gpu/test_quantize_kernels.py \
  -k "refit and (not guided or (nonfinite and (v9 or v10)))"
gpu_tests 120 "$DIR/refit_packed_gpu_tests.log" -m gpu tests/gpu/test_refit_packed.py
SMALL=(tests/gpu/test_quantize_kernels.py -k "refit and (v9 or v10) and not large and not 4096 and not guided")
PACKED=(tests/gpu/test_refit_packed.py -k "v2 and not 1536 and not 2048")
for tool in memcheck racecheck; do
  sanitize "$tool" 60 "$DIR/${tool}_refit.log" python3 -m pytest -q -p no:cacheprovider -m gpu "${SMALL[@]}"
  sanitize "$tool" 60 "$DIR/${tool}_refit_packed.log" python3 -m pytest -q -p no:cacheprovider -m gpu "${PACKED[@]}"
done
for round in $(seq 1 "${ROUNDS:-2}"); do
  [ "$(left)" -gt 200 ] || break
  timeout 80 python3 profiling/bench_memory_kernels.py --select refit_weights:v2,refit_weights:v9,refit_weights:v10 \
    --sizes-mb 16,64,256,1024 --copy-study-mb "" --no-host-overhead --out "$DIR/memory_refit_verdicts_$round.json" \
    > "$DIR/bench_$round.log" 2>&1
  echo "bench $round exit $?"; grep -E "^copy |^refit" "$DIR/bench_$round.log" | grep -v "\[v2\]"
done
[ "$(left)" -gt 120 ] && { timeout 80 python3 profiling/bench_moe_pack.py --what refit --reps 20 \
  --out "$DIR/refit_packed_verdicts_h200.json" > "$DIR/bench_packed.log" 2>&1; echo "bench_packed exit $?";
  grep -E "qwen3|v2 |v1 " "$DIR/bench_packed.log" | head -30; }
if [ "$(left)" -gt 110 ]; then
  prebuild_engine_test_models 60 "$DIR/build_engine.log"; echo "engine build exit $? (${SECONDS}s)"
  gpu_tests $(( $(left) - 5 )) "$DIR/rl_gpu_tests.log" -m gpu tests/rl
fi
echo "== done ($(left)s left)"
