#!/usr/bin/env bash
# The RL layer's GPU tests (the rollout engine's decode in and out of CUDA graphs, its weight sync, the trainer's
# quantizer) on the H200 with the decode kernel as a programmatic dependent launch (attention.DECODE_PDL, the default
# since the twenty-fourth session).
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_engine_decode_pdl.sh
#   -> $OUT/engine_decode_pdl.tar
set -uo pipefail
OUT=${OUT:-runs/engine_decode_pdl}
BUDGET=${BUDGET:-400}
DIR="$OUT/engine_decode_pdl"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
prebuild_engine_test_models 90 "$DIR/build_engine.log"; echo "engine build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_engine.log"
gpu_tests $(( $(left) - 10 )) "$DIR/rl_gpu_tests.log" -m gpu tests/rl
echo "== done ($(left)s left)"
