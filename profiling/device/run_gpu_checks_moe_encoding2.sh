#!/usr/bin/env bash
# Issue 4, one H200 call (seventh session of 2026-12-02): the MoE weight encoding with two rotations and
# two plain left shifts per code word (a0 = q & M, a1 = rotl 12, a2/a3 = rotl 8 ^ shl 2/6) instead of four
# rotations, so ptxas moves two of the four shifts per k16 step from the ALU pipe (SHF) to the FMA pipe
# (IMAD.SHL); the instruction count is unchanged (cuobjdump, 30B decode kernels: SHF 149 -> 85, IMAD.SHL
# 9 -> 73 in the T=64 gate_up).
#   (1) the MoE GPU tests and the refit-packed GPU tests (the packers' tables follow the encoding)
#   (2) same-run A/B of the layer, this tree against BASE (.ab_base: the previous commit's python/, cuda/,
#       codegen/ and bench script, old encoding), two rounds each in turn, auto table, T = 1, 8, 32, 64, 256
#   (3) memcheck / racecheck on the tiny layer with the time left
# Base copy (ignored by git, carried): rm -rf .ab_base && mkdir .ab_base && git archive BASE_COMMIT python cuda \
#   codegen profiling/bench_moe_gemm.py profiling/device/gpu_env.sh | tar -x -C .ab_base
# Usage (repo root; carry .whl and .ab_base): OUT=$OUT bash profiling/device/run_gpu_checks_moe_encoding2.sh -> $OUT/enc2.tar
set -uo pipefail
OUT=${OUT:-runs/enc2}
BUDGET=${BUDGET:-640}
BASE=${BASE:-.ab_base}
DIR="$OUT/enc2"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
PREBUILD='
import sys
from concurrent.futures import ThreadPoolExecutor
from trace_kernels import jit, shapes
from trace_kernels.codegen.ops import moe_gemm as cg, quantize as cq
specs = {}
for name in sys.argv[1:]:
    for s in cg.specs_for_shape(shapes.resolve(name), ("auto",)):
        specs[s.name] = s
    for s in cq.specs_for_shape(shapes.resolve(name)):
        specs[s.name] = s
with ThreadPoolExecutor(16) as pool:
    bad = [n for n, e in zip(specs, pool.map(lambda s: jit.build(s), specs.values())) if isinstance(e, Exception)]
print("built", len(specs), "bad", bad)
'
timeout 100 python3 -c "$PREBUILD" qwen3-30b-a3b qwen3-235b-a22b > "$DIR/build_new.log" 2>&1
echo "new build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_new.log"
PYTHONPATH=/tmp/site:$PWD/$BASE/python:$PWD/rl timeout 100 python3 -c "$PREBUILD" qwen3-30b-a3b qwen3-235b-a22b \
  > "$DIR/build_base.log" 2>&1
echo "base build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_base.log"
timeout 100 python3 profiling/moe_prebuild.py --jobs 16 tiny > "$DIR/build_tiny.log" 2>&1
echo "tiny build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_tiny.log"
gpu_tests 100 "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
gpu_tests 90 "$DIR/refit_packed_gpu_tests.log" tests/gpu/test_refit_packed.py
TOKENS=1,8,32,64,256
for round in 1 2; do
  for tree in new base; do
    [ "$(left)" -lt 60 ] && break 2
    bench_moe_tree "$tree" "$DIR" moe_gemm_h200_encoding2 "$round" "$TOKENS" 80 "$BASE"
  done
done
limit=$(( ($(left) - 5) / 2 )); [ "$limit" -gt 60 ] && limit=60
[ "$limit" -gt 15 ] && moe_sanitizers "$DIR" "$limit"
