#!/usr/bin/env bash
# The ws MoE GEMM with every producer warp gathering activation rows (2026-12-02), on the H200
# (< 9 min): build the MoE kernels (tiny + 30B tables and EXTRA_TILES); the MoE GPU tests (every
# tiling bitwise against v1, fused quantization exact); memcheck + racecheck on the tiny smoke run of
# both variants; a prefill tile sweep of v1 and ws on qwen3-30b-a3b (T = 1024, 4096, 16384); and the
# paired whole-generate cost of guidance capture at the quick benchmark's batch (64 x 1K prompts,
# 128 new tokens), split into in-graph work (compact-noqueue), device-side queueing (compact-nocopy)
# and the host copies (compact). Outputs in $OUT/pf/, tarred to $OUT/pf.tar.
# Usage (repo root; carry .whl): OUT=$OUT bash profiling/device/run_gpu_checks_moe_prefill.sh
set -uo pipefail
BUDGET=${BUDGET:-540}
W="$OUT/pf"; mkdir -p "$W"; trap 'tar -cf "$OUT/pf.tar" -C "$W" .' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
export TRACE_KERNELS_CACHE_DIR=/tmp/tkcache
echo "== build ($(left)s left)"
timeout 150 python3 profiling/moe_prebuild.py --jobs 15 tiny qwen3-30b-a3b > "$W/build_moe.log" 2>&1
echo "moe build exit $?"; tail -1 "$W/build_moe.log"
echo "== MoE GPU tests ($(left)s left)"
gpu_tests 90 "$W/moe_tests.log" tests/gpu/test_moe_gemm.py
echo "== sanitizers ($(left)s left)"
for tool in memcheck racecheck; do
  sanitize $tool 60 "$W/$tool.log" python3 profiling/moe_gemm_smoke.py --shape tiny --tokens 37 --variants v1,ws
done
echo "== prefill sweep ($(left)s left)"
timeout 150 python3 profiling/sweep_moe_gemm_tiles.py --shape qwen3-30b-a3b --tokens 1024,4096,16384 \
  --variant v1,ws --tile-tokens 128,256 --stages 3,4 --min-blocks 1 --warpgroups 2 --overlap 0,1 \
  --m-tiles 1,2 --reps 10 --out "$W/moe_gemm_prefill_sweep_h200.json" > "$W/sweep.log" 2>&1
echo "sweep exit $?"; grep -E "best|skip" "$W/sweep.log" | cut -c1-400
t=$(( $(left) - 10 ))
echo "== capture A/B ($(left)s left, ${t}s for it)"
timeout "$t" python3 profiling/bench_rollout.py --preset bench --prompt-lens "" --output-len 128 \
  --capture-ab-generate 64:1024:128 --ab-generate-arms off,compact,compact-nocopy,compact-noqueue \
  --ab-generate-rounds 3 --out "$W/capture_ab_h200_b64.json" > "$W/capture_ab.log" 2>&1
echo "capture A/B exit $?"; tail -8 "$W/capture_ab.log"
echo "== done ($(left)s left)"
