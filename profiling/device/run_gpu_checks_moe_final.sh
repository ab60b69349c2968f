#!/usr/bin/env bash
# The MoE GEMMs as committed (ALU dequantization, auto table: ws below ~1 row per expert, v1 above;
# 2026-12-01), on the H200 (< 9 min): build the MoE kernels (3 presets, tables + EXTRA_TILES) and the
# engine's kernels; MoE GPU tests (every tiling bitwise against v1, fused quantization exact);
# memcheck + racecheck on the tiny smoke run of both variants; the rollout engine's GPU tests; the
# benchmark of the grid (both presets, T = 1..16384, the auto table and both variants, CUDA
# graph replays, BF16 _grouped_mm and the copy bandwidth in the same run). Outputs in $OUT/fin/,
# tarred to $OUT/fin.tar.
# Usage (repo root; carry .whl): OUT=$OUT bash profiling/device/run_gpu_checks_moe_final.sh
set -uo pipefail
BUDGET=${BUDGET:-540}
W="$OUT/fin"; mkdir -p "$W"; trap 'tar -cf "$OUT/fin.tar" -C "$W" .' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
export TRACE_KERNELS_CACHE_DIR=/tmp/tkcache
echo "== build ($(left)s left)"
timeout 200 python3 profiling/moe_prebuild.py --jobs 14 tiny qwen3-30b-a3b qwen3-235b-a22b > "$W/build_moe.log" 2>&1
echo "moe build exit $?"; tail -1 "$W/build_moe.log"
timeout 100 python3 profiling/prebuild_engine_kernels.py "E=32,H=512,I=256,k=4,hq=8,hkv=2,hd=64:1,8,256,2560" \
  "E=8,H=64,I=64,k=2,hq=4,hkv=2,hd=64:1,4,8,32,40" > "$W/build_engine.log" 2>&1
echo "engine build exit $?"; tail -1 "$W/build_engine.log"
echo "== MoE GPU tests ($(left)s left)"
gpu_tests 100 "$W/moe_tests.log" tests/gpu/test_moe_gemm.py
echo "== sanitizers ($(left)s left)"
for tool in memcheck racecheck; do
  sanitize $tool 60 "$W/$tool.log" python3 profiling/moe_gemm_smoke.py --shape tiny --tokens 37 --variants v1,ws
done
echo "== engine GPU tests ($(left)s left)"
gpu_tests 120 "$W/engine_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_guidance_capture.py \
  tests/rl/test_engine_kernels.py
t=$(( $(left) - 10 ))
echo "== benchmark ($(left)s left, ${t}s for it)"
timeout "$t" python3 profiling/bench_moe_gemm.py --reps 10 --variants auto,v1,ws --shapes qwen3-30b-a3b,qwen3-235b-a22b \
  --tokens 1,8,32,64,128,256,1024,4096,16384 --out "$W/moe_gemm_h200.json" > "$W/bench.log" 2>&1
echo "bench exit $?"; tail -20 "$W/bench.log"
echo "== done ($(left)s left)"
