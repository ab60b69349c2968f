#!/usr/bin/env bash
# The MoE GPU checks owed since the MoE code's last H200 run (its counter pools moved to ops._common, the capture check
# of c882bf5, UnsupportedShape of fe0d9a0), in one call (written in the thirty-first session, 2026-12-05; not yet run:
# its calls got no machine), every step under `timeout`:
#   1. build the MoE kernels of tiny, qwen3-30b-a3b and qwen3-235b-a22b (moe_prebuild.py, 16 jobs)
#   2. the MoE GEMM, sampling, packed-refit and NVFP4-property GPU tests
#   3. compute-sanitizer memcheck and racecheck on the fused gate_up / down tests (moe_sanitizers)
#   4. with BENCH=1, bench_moe_gemm.py (auto tables) on both Qwen3 presets with what is left of BUDGET
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_moe_suite.sh -> $OUT/moe_suite.tar
set -uo pipefail
OUT=${OUT:-runs/moe_suite}
BUDGET=${BUDGET:-565}
DIR="$OUT/moe_suite"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"

moe_build 170 "$DIR/build_moe.log" tiny qwen3-30b-a3b qwen3-235b-a22b
gpu_tests 130 "$DIR/gpu_tests.log" -m gpu tests/gpu/test_moe_gemm.py tests/gpu/test_sampling_kernel.py \
  tests/gpu/test_refit_packed.py tests/test_nvfp4_properties.py
moe_sanitizers "$DIR" 40

limit=$(( $(left) - 10 ))
if [ "${BENCH:-0}" = 1 ] && [ "$limit" -gt 40 ]; then
  timeout "$limit" python3 profiling/bench_moe_gemm.py --variants auto --reps 10 \
    --shapes qwen3-30b-a3b,qwen3-235b-a22b --tokens 1,8,32,64,128,256,1024,4096,16384 \
    --out "$DIR/moe_gemm.json" > "$DIR/bench_moe.log" 2>&1
  echo "moe bench exit $? (${SECONDS}s)"; tail -22 "$DIR/bench_moe.log"
fi
echo "== done ($(left)s left)"
