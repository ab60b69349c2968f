#!/usr/bin/env bash
# Benchmarks after the 2026-12-02 MoE epilogue / refit changes, on the H200 (< 9 min): the issue-4
# grid with the default (auto) table (both presets, T = 1..16384, BF16 _grouped_mm and the copy
# bandwidth in the same run), the RL weight sync (bench_moe_pack --what refit: two-step vs
# ops.refit_weights_packed_), and bench_rollout --quick (NVFP4 vs BF16 rollout decode, refit s/GB).
# Outputs in $OUT/fb/, tarred to $OUT/fb.tar.
# Usage (repo root; carry .whl): OUT=$OUT bash profiling/device/run_gpu_bench_moe_final2.sh
set -uo pipefail
BUDGET=${BUDGET:-560}
W="$OUT/fb"; mkdir -p "$W"; trap 'tar -cf "$OUT/fb.tar" -C "$W" .' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
export TRACE_KERNELS_CACHE_DIR=/tmp/tkcache
echo "== build ($(left)s left)"
timeout 120 python3 profiling/moe_prebuild.py --jobs 15 qwen3-30b-a3b qwen3-235b-a22b > "$W/build_moe.log" 2>&1
echo "moe build exit $?"; tail -1 "$W/build_moe.log"
echo "== MoE benchmark ($(left)s left)"
timeout 200 python3 profiling/bench_moe_gemm.py --reps 10 --variants auto --shapes qwen3-30b-a3b,qwen3-235b-a22b \
  --tokens 1,8,32,64,128,256,1024,4096,16384 --out "$W/moe_gemm_h200.json" > "$W/bench.log" 2>&1
echo "bench exit $?"; tail -20 "$W/bench.log"
echo "== refit benchmark ($(left)s left)"
timeout 80 python3 profiling/bench_moe_pack.py --what refit --out "$W/refit_packed_h200.json" > "$W/refit.log" 2>&1
echo "refit exit $?"; tail -5 "$W/refit.log"
t=$(( $(left) - 10 ))
echo "== rollout quick ($(left)s left, ${t}s for it)"
timeout "$t" python3 profiling/bench_rollout.py --quick --out "$W/rollout_h200_quick.json" > "$W/rollout.log" 2>&1
echo "rollout exit $?"; tail -12 "$W/rollout.log"
echo "== done ($(left)s left)"
