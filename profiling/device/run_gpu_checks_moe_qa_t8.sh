#!/usr/bin/env bash
# Issue 4: the fused gate_up's row quantization at T <= 32 in-epilogue (auto) or by the quantize kernel after
# a SwiGLU-only GEMM (auto_qa), same run, both presets: the open question is the one-warpgroup T=8 tile,
# which keeps the in-epilogue quantization (+25% over its plain GEMM on 30B in the fourth session).
# Then the MoE GPU tests of the tiles involved (auto_qa runs every table tile with quantize_after).
# Usage (repo root; carry .whl and .tkcache_moe): TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_moe OUT=$OUT \
#   bash profiling/device/run_gpu_checks_moe_qa_t8.sh      -> $OUT/moe_qa_t8.tar
set -uo pipefail
OUT=${OUT:-runs/moe_qa_t8}
BUDGET=${BUDGET:-330}
DIR="$OUT/moe_qa_t8"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv >> "$DIR/setup.log" 2>&1
timeout 150 python3 profiling/moe_prebuild.py --jobs 16 qwen3-30b-a3b qwen3-235b-a22b > "$DIR/build.log" 2>&1
echo "build exit $? (${SECONDS}s)"; tail -1 "$DIR/build.log"
for round in 1 2; do  # two rounds: the first-timed arm runs 2-3% slow in some runs
  timeout 80 python3 profiling/bench_moe_gemm.py --variants auto,auto_qa --tokens 1,8,32 --reps 10 \
    --out "$DIR/moe_gemm_h200_qa_t8_round$round.json" > "$DIR/bench_round$round.log" 2>&1
  echo "bench round $round exit $? (${SECONDS}s)"; grep -E "^qwen3|^shape" "$DIR/bench_round$round.log" | tail -8
done
