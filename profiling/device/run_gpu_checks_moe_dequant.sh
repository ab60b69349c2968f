#!/usr/bin/env bash
# After the ALU dequantization of the encoded MoE weights (moe_encoding.py, moe_dequant.cuh;
# 2026-12-01), on the H200 (< 9.5 min): build the MoE kernels (3 presets, table + EXTRA_TILES) and the
# rollout engine's kernels in parallel; the engine's GPU tests (its packed weights changed format);
# the MoE GPU tests (every EXTRA_TILES tiling bitwise against v1); the decode tile A/B (table and
# EXTRA_TILES at T = 1, 8, 64, 256 on both MoE presets, CUDA-graph replays); Nsight Compute of the
# overlapped ws decode tile if time is left. Outputs in $OUT/dq/, tarred to $OUT/dq.tar.
# Usage (repo root; carry .whl): OUT=$OUT bash profiling/device/run_gpu_checks_moe_dequant.sh
set -uo pipefail
BUDGET=${BUDGET:-560}
W="$OUT/dq"; mkdir -p "$W"; trap 'tar -cf "$OUT/dq.tar" -C "$W" .' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
export TRACE_KERNELS_CACHE_DIR=/tmp/tkcache
echo "== build ($(left)s left)"
( timeout 240 python3 profiling/moe_prebuild.py --jobs 12 tiny qwen3-30b-a3b qwen3-235b-a22b > "$W/build_moe.log" 2>&1
  echo "moe build exit $?" >> "$W/build_moe.log" ) &
timeout 200 python3 profiling/prebuild_engine_kernels.py "E=32,H=512,I=256,k=4,hq=8,hkv=2,hd=64:1,8,256,2560" \
  "E=8,H=64,I=64,k=2,hq=4,hkv=2,hd=64:1,4,8,32,40" > "$W/build_engine.log" 2>&1
echo "engine build exit $?"; tail -1 "$W/build_engine.log"
echo "== engine GPU tests ($(left)s left)"
timeout 170 python3 -m pytest tests/rl/test_engine_gpu.py tests/rl/test_guidance_capture.py tests/rl/test_engine_kernels.py \
  -q -rfE -p no:cacheprovider > "$W/engine_tests.log" 2>&1
echo "engine tests exit $?"; grep -E "^FAILED" "$W/engine_tests.log" | head -5; tail -1 "$W/engine_tests.log"
wait; tail -2 "$W/build_moe.log"
echo "== MoE GPU tests ($(left)s left)"
timeout 90 python3 -m pytest tests/gpu/test_moe_gemm.py -q -rfE -p no:cacheprovider > "$W/moe_tests.log" 2>&1
echo "moe tests exit $?"; grep -E "^FAILED" "$W/moe_tests.log" | head -5; tail -1 "$W/moe_tests.log"
t=$(( $(left) - 50 ))
echo "== decode tile A/B ($(left)s left, ${t}s for it)"
timeout "$t" python3 profiling/bench_moe_gemm.py --reps 10 --variants v1,ws --shapes qwen3-30b-a3b,qwen3-235b-a22b \
  --tokens 1,8,64,256 --extra-tokens 1,8,64,256 --out "$W/moe_gemm_h200_decode_tiles.json" > "$W/bench.log" 2>&1
echo "bench exit $?"; grep -E "extra tiles|^qwen" "$W/bench.log" | tail -24
t=$(( $(left) - 5 ))
if [ "$t" -gt 30 ]; then
  echo "== ncu ws overlapped decode tile, T=64 ($(left)s left)"
  timeout "$t" ncu --clock-control none --kernel-name regex:moe_gemm_ --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section Occupancy \
    python3 profiling/moe_gemm_ncu_case.py --shape qwen3-30b-a3b --tokens 64 --variant ws --extra 7 > "$W/ncu.log" 2>&1
  echo "ncu exit $?"; grep -E "Duration|DRAM Throughput|Issued Warp|Eligible Warps|Warp Cycles Per Issued" "$W/ncu.log"
fi
echo "== done ($(left)s left)"
