#!/usr/bin/env bash
# Issue 4, second call of the PDL session: the rollout engine's GPU tests with its MoE GEMMs launched
# with pdl=True (the first call's 60 s were spent building its kernels), then a sweep of down-GEMM
# decode tilings on qwen3-30b-a3b (its down GEMM, K=768, ran at ~54% of copy against the gate_up's ~71%
# in moe_gemm_h200_pdl.json).
# Usage (repo root; carry .whl and .tkcache_moe): TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_moe OUT=$OUT \
#   bash profiling/device/run_gpu_checks_moe_pdl_engine.sh      -> $OUT/moe_pdl_engine.tar
set -uo pipefail
OUT=${OUT:-runs/moe_pdl_engine}
BUDGET=${BUDGET:-560}
DIR="$OUT/moe_pdl_engine"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
timeout 120 python3 profiling/prebuild_engine_kernels.py "E=8,H=64,I=64,k=2,hq=4,hkv=2,hd=64:1,8,40" \
  "E=32,H=512,I=256,k=4,hq=8,hkv=2,hd=64:1,8,40" > "$DIR/build_engine.log" 2>&1
echo "engine build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_engine.log"
gpu_tests 200 "$DIR/engine_gpu_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_engine.py -m gpu
limit=$(( $(left) - 5 )); [ "$limit" -gt 240 ] && limit=240
timeout "$limit" python3 profiling/sweep_moe_gemm_tiles.py --shape qwen3-30b-a3b --kinds down_routed --tokens 8,32,64 \
  --tile-tokens 8 --stages 2,3,4,6 --chunks-per-stage 1,2,4 --min-blocks 2,4 --warpgroups 1,2 --overlap 0 \
  --reps 10 --out "$DIR/moe_down_decode_sweep_h200.json" > "$DIR/sweep.log" 2>&1
echo "sweep exit $? (${SECONDS}s)"; grep -E "best|built" "$DIR/sweep.log" | cut -c1-400
