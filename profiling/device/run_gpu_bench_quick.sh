#!/usr/bin/env bash
# One `profiling/bench.py --quick` on the H200 with the current defaults (the README's performance table):
# memory kernels (every variant, 16 / 256 MB), the Qwen3-30B-A3B MoE layer (T = 1 .. 16384), paged decode
# attention (the default NVFP4 / BF16 kernels against SDPA, incl. batch 32 x 32K), kv_append, sampling, and
# the rollout's quick arms, after the kernels are compiled in parallel (a carried cache makes that short).
# Usage (repo root; carry .whl and a cache): TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_bench OUT=$OUT \
#   bash profiling/device/run_gpu_bench_quick.sh      -> $OUT/bench_quick.tar
set -uo pipefail
OUT=${OUT:-runs/bench_quick}
BUDGET=${BUDGET:-560}
DIR="$OUT/bench_quick"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv >> "$DIR/setup.log" 2>&1

timeout 150 python3 profiling/moe_prebuild.py --jobs 16 qwen3-30b-a3b > "$DIR/build_moe.log" 2>&1
echo "moe build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_moe.log"
timeout 120 python3 profiling/prebuild_engine_kernels.py qwen3-30b-a3b:1,8,64,256,1024,16384 > "$DIR/build_engine.log" 2>&1
echo "engine build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_engine.log"

limit=$(( $(left) - 10 ))
timeout "$limit" python3 profiling/bench.py --quick --time-budget $(( limit - 40 )) \
  --out "$DIR/bench_h200_quick.json" --plots-dir "$DIR/plots" > "$DIR/bench.log" 2>&1
echo "bench exit $? (limit ${limit}s, ${SECONDS}s)"; grep -E "^\|" "$DIR/bench.log" | tail -45
