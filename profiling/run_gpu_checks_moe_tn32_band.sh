#!/usr/bin/env bash
# Issue 4, one H200 call (eleventh session of 2026-12-02): TN=32 up to 64 routed rows per expert (was 32),
# after run_gpu_checks_moe_tn64.sh's sweep, against the previous commit.
#   (1) the MoE GPU tests (every table and extra tile bitwise, batch-invariant, graphs, PDL)
#   (2) same-run A/B of the layer, this tree against BASE (.ab_base, see run_gpu_checks_moe_rings_ab.sh), two
#       rounds each in turn, auto table, T = 256 to 2048
#   (3) the rollout engine's GPU tests
#   (4) memcheck / racecheck on the tiny layer with the time left
# Usage (repo root; carry .whl, .tkcache and .ab_base): OUT=$OUT bash profiling/run_gpu_checks_moe_tn32_band.sh
set -uo pipefail
OUT=${OUT:-runs/moe_tn32_band}
BUDGET=${BUDGET:-560}
BASE=${BASE:-.ab_base}
DIR="$OUT/moe_tn32_band"
mkdir -p "$DIR"
source profiling/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
PREBUILD='
import sys
from concurrent.futures import ThreadPoolExecutor
from trace_kernels import jit, shapes
from trace_kernels.codegen.ops import moe_gemm as cg, quantize as cq
specs = {}
for name in sys.argv[1:]:
    for s in cg.specs_for_shape(shapes.resolve(name), ("auto",)) + cq.specs_for_shape(shapes.resolve(name)):
        specs[s.name] = s
with ThreadPoolExecutor(16) as pool:
    list(pool.map(jit.build, specs.values()))
print("built", len(specs))
'
timeout 120 python3 -c "$PREBUILD" qwen3-30b-a3b qwen3-235b-a22b > "$DIR/build_new.log" 2>&1
echo "new build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_new.log"
PYTHONPATH=/tmp/site:$PWD/$BASE/python:$PWD/rl timeout 120 python3 -c "$PREBUILD" qwen3-30b-a3b qwen3-235b-a22b \
  > "$DIR/build_base.log" 2>&1
echo "base build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_base.log"
timeout 150 python3 profiling/moe_prebuild.py --jobs 16 tiny qwen3-30b-a3b > "$DIR/build_tests.log" 2>&1
echo "test build exit $? (${SECONDS}s)"; tail -2 "$DIR/build_tests.log"
prebuild_engine_test_models 150 "$DIR/build_engine.log"; echo "engine build (${SECONDS}s)"; tail -1 "$DIR/build_engine.log"
gpu_tests 150 "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
TOKENS=256,512,768,1024,1536,2048
for round in 1 2; do
  for tree in new base; do
    [ "$(left)" -lt 200 ] && break 2
    bench_moe_tree "$tree" "$DIR" moe_gemm_h200_tn32_band "$round" "$TOKENS" 100 "$BASE"
  done
done
gpu_tests $(( $(left) - 70 )) "$DIR/engine_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_guidance_capture.py \
  tests/rl/test_engine_kernels.py
limit=$(( ($(left) - 5) / 2 )); [ "$limit" -gt 60 ] && limit=60
[ "$limit" -gt 15 ] && moe_sanitizers "$DIR" "$limit"
