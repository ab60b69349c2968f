#!/usr/bin/env bash
# Issue 4, one H200 call (eleventh session of 2026-12-02): the gate_up below 1/8 routed row per expert on the
# ws tile with one consumer warpgroup at 3 CTAs/SM (run_gpu_checks_moe_t1_tiles.sh's sweep), against the
# previous commit: the MoE GPU tests, a same-run A/B of the layer (two rounds, T = 1, 2, 4, 8), the rollout
# engine's GPU tests (the tile is an extra that every earlier sanitizer run covered).
# Prepared in the eleventh session and not run (no device time left): make AUTO_GATE_UP_TABLE's first row
# TileConfig(8, 5, 3, 1, variant="ws", chunks_per_stage=2), then run it with .ab_base = the commit before.
# Usage (repo root; carry .whl, .tkcache and .ab_base): OUT=$OUT bash profiling/run_gpu_checks_moe_ws1wg.sh
set -uo pipefail
OUT=${OUT:-runs/moe_ws1wg}
BUDGET=${BUDGET:-240}
BASE=${BASE:-.ab_base}
DIR="$OUT/moe_ws1wg"
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
TOKENS=1,2,4,8
for round in 1 2; do
  for tree in new base; do
    [ "$(left)" -lt 100 ] && break 2
    bench_moe_tree "$tree" "$DIR" moe_gemm_h200_ws1wg "$round" "$TOKENS" 40 "$BASE"
  done
done
gpu_tests $(( $(left) - 20 )) "$DIR/engine_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_guidance_capture.py \
  tests/rl/test_engine_kernels.py
