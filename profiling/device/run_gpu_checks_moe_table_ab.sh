#!/usr/bin/env bash
# Issue 4, one H200 call: this tree's MoE tile table against BASE's, the checks a default change needs.
#   (1) the MoE GPU tests (every table and extra tile bitwise, batch-invariant, graphs, PDL)
#   (2) same-run A/B of the layer, this tree against BASE, two rounds each in turn, auto table, T = TOKENS;
#       JSONs $DIR/NAME_{new,base}ROUND.json
#   (3) the rollout engine's GPU tests
#   (4) memcheck / racecheck on the tiny layer with the time left
# Base copy (ignored by git, carried): rm -rf .ab_base && mkdir .ab_base && git archive BASE_COMMIT python cuda \
#   codegen profiling/bench_moe_gemm.py profiling/device/gpu_env.sh | tar -x -C .ab_base
# Usage (repo root; carry .whl, .tkcache and .ab_base):
#   OUT=$OUT NAME=moe_gemm_h200_x TOKENS=1,8,64 bash profiling/device/run_gpu_checks_moe_table_ab.sh -> $OUT/NAME.tar
set -uo pipefail
OUT=${OUT:-runs/moe_table_ab}
NAME=${NAME:?set NAME: the name of the results}
TOKENS=${TOKENS:-1,8,32,64,128,256,512,1024,4096,16384}
BUDGET=${BUDGET:-560}
BASE=${BASE:-.ab_base}
DIR="$OUT/$NAME"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
moe_prebuild_trees "$DIR" auto "qwen3-30b-a3b qwen3-235b-a22b" "$BASE"
timeout 150 python3 profiling/moe_prebuild.py --jobs 16 tiny qwen3-30b-a3b > "$DIR/build_tests.log" 2>&1
echo "test build exit $? (${SECONDS}s)"; tail -2 "$DIR/build_tests.log"
prebuild_engine_test_models 150 "$DIR/build_engine.log"; echo "engine build (${SECONDS}s)"; tail -1 "$DIR/build_engine.log"
gpu_tests 150 "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
moe_tree_ab "$DIR" "$NAME" "$TOKENS" 100 "$BASE" 200
gpu_tests $(( $(left) - 70 )) "$DIR/engine_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_guidance_capture.py \
  tests/rl/test_engine_kernels.py
limit=$(( ($(left) - 5) / 2 )); [ "$limit" -gt 60 ] && limit=60
[ "$limit" -gt 15 ] && moe_sanitizers "$DIR" "$limit"
