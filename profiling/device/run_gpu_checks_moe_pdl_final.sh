#!/usr/bin/env bash
# Final checks of the sixth session of 2026-12-02 (PDL between the MoE layer's kernels, the short-K down
# tile): the quantize kernels' GPU tests (quantize.cuh opens with the PDL wait), every MoE GPU test (PDL
# chains included), the rollout engine's GPU tests (its GEMMs on PDL, its small shapes on the short-K down
# table), memcheck and racecheck on the tiny fused gate_up / down and on a PDL case.
# Usage (repo root; carry .whl and a cache with the quantize kernels, e.g. built by
# jit.build_all over kernel_sets' quantize specs): TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_final OUT=$OUT \
#   bash profiling/device/run_gpu_checks_moe_pdl_final.sh      -> $OUT/moe_pdl_final.tar
set -uo pipefail
OUT=${OUT:-runs/moe_pdl_final}
BUDGET=${BUDGET:-540}
DIR="$OUT/moe_pdl_final"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
timeout 120 python3 profiling/moe_prebuild.py --jobs 16 tiny qwen3-30b-a3b > "$DIR/build.log" 2>&1
echo "build exit $? (${SECONDS}s)"; tail -1 "$DIR/build.log"
timeout 60 python3 profiling/prebuild_engine_kernels.py "E=8,H=64,I=64,k=2,hq=4,hkv=2,hd=64:1,8,40" \
  "E=32,H=512,I=256,k=4,hq=8,hkv=2,hd=64:1,8,40" > "$DIR/build_engine.log" 2>&1
echo "engine build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_engine.log"
gpu_tests 90 "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
gpu_tests 100 "$DIR/quantize_gpu_tests.log" tests/gpu/test_quantize_kernels.py -k "test_quantize or nonfinite_flag_quantize"
gpu_tests 120 "$DIR/engine_gpu_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_engine.py -m gpu
limit=$(( ($(left) - 40) / 2 )); [ "$limit" -gt 60 ] && limit=60
[ "$limit" -gt 15 ] && moe_sanitizers "$DIR" "$limit"
limit=$(( $(left) - 3 )); [ "$limit" -gt 60 ] && limit=60
[ "$limit" -gt 15 ] && sanitize racecheck "$limit" "$DIR/sanitizer_racecheck_pdl.log" python3 -m pytest -q \
  -p no:cacheprovider tests/gpu/test_moe_gemm.py -k "programmatic and 8 and v1"
