#!/usr/bin/env bash
# The committed MoE GEMMs after the 2026-12-02 changes (fused_min_blocks: only the decode tiles' fused
# gate_up bounded at 4 CTAs/SM), on the H200 (< 7 min): build (3 presets), the MoE GPU tests, memcheck +
# racecheck on the tiny smoke run of both variants, the issue-4 benchmark grid (auto table, both presets,
# BF16 _grouped_mm and the copy bandwidth in the same run), then bench_rollout --quick with what is left.
# Outputs in $OUT/f3/, tarred to $OUT/f3.tar.
# Usage (repo root; carry .whl): OUT=$OUT bash profiling/device/run_gpu_checks_moe_final3.sh
set -uo pipefail
BUDGET=${BUDGET:-400}
W="$OUT/f3"; mkdir -p "$W"; trap 'tar -cf "$OUT/f3.tar" -C "$W" .' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
export TRACE_KERNELS_CACHE_DIR=/tmp/tkcache
echo "== build ($(left)s left)"
timeout 120 python3 profiling/moe_prebuild.py --jobs 15 tiny qwen3-30b-a3b qwen3-235b-a22b > "$W/build_moe.log" 2>&1
echo "moe build exit $?"; tail -1 "$W/build_moe.log"
echo "== MoE GPU tests ($(left)s left)"
gpu_tests 60 "$W/moe_tests.log" tests/gpu/test_moe_gemm.py
for tool in memcheck racecheck; do
  sanitize $tool 40 "$W/$tool.log" python3 profiling/moe_gemm_smoke.py --shape tiny --tokens 37 --variants v1,ws
done
echo "== MoE benchmark ($(left)s left)"
timeout 100 python3 profiling/bench_moe_gemm.py --reps 10 --variants auto --shapes qwen3-30b-a3b,qwen3-235b-a22b \
  --tokens 1,8,32,64,128,256,1024,4096,16384 --out "$W/moe_gemm_h200.json" > "$W/bench.log" 2>&1
echo "bench exit $?"; tail -19 "$W/bench.log"
t=$(( $(left) - 10 ))
echo "== rollout quick ($(left)s left, ${t}s for it)"
[ "$t" -gt 60 ] && timeout "$t" python3 profiling/bench_rollout.py --quick --out "$W/rollout_h200_quick.json" > "$W/rollout.log" 2>&1
echo "rollout exit $?"; tail -9 "$W/rollout.log"
echo "== done ($(left)s left)"
