#!/usr/bin/env bash
# End-to-end effect of the MoE GEMMs' ALU dequantization (2026-12-01) on the H200 (< 8 min): prebuild
# the kernels of the `bench` preset, then bench_rollout --quick (BF16 vs NVFP4 rollout decode, guidance
# capture, refit time: the refit now also encodes the packed weights). Outputs in $OUT/ro/, tarred to
# $OUT/ro.tar. Usage (repo root; carry .whl): OUT=$OUT bash profiling/device/run_gpu_checks_rollout_dequant.sh
set -uo pipefail
BUDGET=${BUDGET:-440}
W="$OUT/ro"; mkdir -p "$W"; trap 'tar -cf "$OUT/ro.tar" -C "$W" .' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
export TRACE_KERNELS_CACHE_DIR=/tmp/tkcache
echo "== prebuild ($(left)s left)"
timeout 150 python3 profiling/prebuild_engine_kernels.py qwen3-30b-a3b:2,64,16384 > "$W/build.log" 2>&1
echo "prebuild exit $?"; grep -E "FAILED|built" "$W/build.log" | tail -3
echo "== bench_rollout --quick ($(left)s left)"
timeout $(( $(left) - 10 )) python3 profiling/bench_rollout.py --quick --out "$W/rollout_h200_quick_dequant.json" \
  > "$W/bench.log" 2>&1
echo "bench exit $?"; tail -16 "$W/bench.log"
echo "== done ($(left)s left)"
