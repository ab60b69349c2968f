#!/usr/bin/env bash
# Issue 4: checks of auto's fused gate_up with the one-warpgroup T=8 tile quantized after the GEMM (the
# table since the fifth session of 2026-12-02): every MoE GPU test (each table and extra tile bitwise,
# batch invariance, graph replay), the rollout engine's GPU tests, and memcheck on the tiny fused gate_up
# over every tiling. Usage (repo root; carry .whl and .tkcache_moe): TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_moe \
#   OUT=$OUT bash profiling/device/run_gpu_checks_moe_qa_default.sh      -> $OUT/moe_qa_default.tar
set -uo pipefail
OUT=${OUT:-runs/moe_qa_default}
BUDGET=${BUDGET:-380}
DIR="$OUT/moe_qa_default"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
timeout 100 python3 profiling/moe_prebuild.py --jobs 16 tiny qwen3-30b-a3b > "$DIR/build.log" 2>&1
echo "build exit $? (${SECONDS}s)"; tail -1 "$DIR/build.log"
timeout 60 python3 profiling/prebuild_engine_kernels.py "E=8,H=64,I=64,k=2,hq=4,hkv=2,hd=64:1,8,40" \
  "E=32,H=512,I=256,k=4,hq=8,hkv=2,hd=64:1,8,40" > "$DIR/build_engine.log" 2>&1
echo "engine build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_engine.log"
gpu_tests 130 "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
gpu_tests 100 "$DIR/engine_gpu_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_engine.py -m gpu
limit=$(( $(left) - 2 )); [ "$limit" -gt 50 ] && limit=50
sanitize memcheck "$limit" "$DIR/sanitizer_memcheck.log" python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_moe_gemm.py -k "test_gate_up_fused_quantization_is_exact and tiny and 64"
