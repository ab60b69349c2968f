#!/usr/bin/env bash
# Issue 4, one H200 call (fourteenth session, 2026-12-03): Nsight Compute on the 30B down GEMM's direct tiles (one
# launch each, clocks not locked): 4 chunks ahead at 4 CTAs/SM (994ada6's tile) and 3 ahead at 8 CTAs/SM at T=64,
# and the TN=16 direct tile at T=128. Reports $DIR/ncu_down_*.txt (section pages) and .raw.csv.
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/run_ncu_moe_down_direct.sh
set -uo pipefail
OUT=${OUT:-runs/moe_down_ncu}
BUDGET=${BUDGET:-300}
DIR="$OUT/moe_down_ncu"
mkdir -p "$DIR"
source profiling/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
for case in "64 wd4_mb4 8,1,4,1,weights_direct=4" "64 wd3_mb8 8,1,8,1,weights_direct=3" \
            "128 tn16_wd2_mb6 16,1,6,1,weights_direct=2"; do
  read -r tokens label fields <<< "$case"
  index=$(python3 -c "from trace_kernels.codegen.ops.moe_gemm import EXTRA_TILES, TileConfig
print(EXTRA_TILES.index(TileConfig($fields)))")
  tn=${fields%%,*}; mb=$(cut -d, -f3 <<< "$fields"); wd=${fields##*=}
  [ "$(left)" -lt 70 ] && break
  ncu_report "$DIR/ncu_down_t${tokens}_$label" 60 "moe_gemm_down_routed_\\w+_tn${tn}_st1_mb${mb}_wg1_pf1_ov0_wd${wd}_sm90a" \
    python3 profiling/moe_gemm_ncu_case.py --shape qwen3-30b-a3b --tokens "$tokens" --repeat 1 --extra="$index"
done
