#!/usr/bin/env bash
# Why the ws fused gate_up is slow at prefill (2026-12-02): Nsight Compute on the qwen3-30b-a3b
# T=4096 fused and plain gate_up of the ws m_tiles=2 tiling (EXTRA_TILES[6]), with line info: speed
# of light, warp states, launch stats and the source-level stall sampling. Outputs in $OUT/we/,
# tarred to $OUT/we.tar (< 4 min).
# Usage (repo root; carry .whl): OUT=$OUT bash profiling/device/run_gpu_checks_moe_ws_epilogue.sh
set -uo pipefail
BUDGET=${BUDGET:-240}
W="$OUT/we"; mkdir -p "$W"; trap 'tar -cf "$OUT/we.tar" -C "$W" .' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
export TRACE_KERNELS_CACHE_DIR=/tmp/tkcache TRACE_KERNELS_LINEINFO=1
echo "== ncu ($(left)s left)"
timeout $(( $(left) - 10 )) ncu --clock-control none --kernel-name regex:moe_gemm_gate_up --launch-skip 2 --launch-count 2 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats \
  --section SourceCounters --import-source yes \
  python3 profiling/moe_gemm_ncu_case.py --shape qwen3-30b-a3b --tokens 4096 --extra 6 --plain > "$W/ncu.log" 2>&1
echo "ncu exit $?"; grep -E "moe_gemm_gate_up|Duration|Issued Warp|Eligible Warps|Compute \(SM\) Thr|DRAM Throughput" "$W/ncu.log" | head -20
echo "== done ($(left)s left)"
