#!/usr/bin/env bash
# The fused gate_up epilogue's row quantization on the branch-free block path, a row per half warp
# with its blocks in registers on the wide tiles, and the decode tiles at 4 CTAs/SM (2026-12-02), on
# the H200 (< 5 min): build the MoE kernels (tiny + 30B tables and EXTRA_TILES); the MoE GPU tests (the
# fused epilogue's codes, scales, operand and guidance bit-exact with nvfp4.quantize of the kernel's
# own h; every tiling bitwise against v1); memcheck + racecheck on the tiny smoke run of both
# variants; the prefill tile sweep of the best v1 and ws tilings (30B, T = 1024, 4096, 16384); the
# benchmark's decode points (both presets, T = 8, 64, 256; auto table; fused vs plain epilogue).
# Outputs in $OUT/rq/, tarred to $OUT/rq.tar.
# Usage (repo root; carry .whl): OUT=$OUT bash profiling/device/run_gpu_checks_moe_rowquant.sh
set -uo pipefail
BUDGET=${BUDGET:-300}
W="$OUT/rq"; mkdir -p "$W"; trap 'tar -cf "$OUT/rq.tar" -C "$W" .' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
export TRACE_KERNELS_CACHE_DIR=/tmp/tkcache
echo "== build ($(left)s left)"
timeout 150 python3 profiling/moe_prebuild.py --jobs 15 tiny qwen3-30b-a3b qwen3-235b-a22b > "$W/build_moe.log" 2>&1
echo "moe build exit $?"; tail -1 "$W/build_moe.log"
echo "== MoE GPU tests ($(left)s left)"
gpu_tests 90 "$W/moe_tests.log" tests/gpu/test_moe_gemm.py
echo "== sanitizers ($(left)s left)"
for tool in memcheck racecheck; do
  sanitize $tool 60 "$W/$tool.log" python3 profiling/moe_gemm_smoke.py --shape tiny --tokens 37 --variants v1,ws
done
echo "== prefill sweep ($(left)s left)"
timeout 100 python3 profiling/sweep_moe_gemm_tiles.py --shape qwen3-30b-a3b --tokens 1024,4096,16384 \
  --variant v1,ws --tile-tokens 128,256 --stages 4 --min-blocks 1 --warpgroups 2 --overlap 0,1 \
  --m-tiles 1,2 --reps 8 --out "$W/moe_gemm_prefill_sweep_h200.json" > "$W/sweep.log" 2>&1
echo "sweep exit $?"; grep -E "best|skip" "$W/sweep.log" | cut -c1-400
t=$(( $(left) - 10 ))
echo "== decode bench ($(left)s left, ${t}s for it)"
timeout "$t" python3 profiling/bench_moe_gemm.py --reps 10 --variants auto --shapes qwen3-30b-a3b,qwen3-235b-a22b \
  --tokens 8,64,256 --out "$W/moe_gemm_decode_h200.json" > "$W/bench.log" 2>&1
echo "bench exit $?"; tail -12 "$W/bench.log"
echo "== done ($(left)s left)"
