#!/usr/bin/env bash
# Issue 4, one H200 call (fourteenth session, 2026-12-03): Nsight Compute on the 30B down GEMM's direct tiles (one
# launch each, clocks not locked): 4 chunks ahead at 4 CTAs/SM (994ada6's tile) and 3 ahead at 8 CTAs/SM at T=64,
# and the TN=16 direct tile at T=128. Reports $DIR/ncu_down_*.txt (section pages) and .raw.csv.
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_ncu_moe_down_direct.sh
set -uo pipefail
OUT=${OUT:-runs/moe_down_ncu}
BUDGET=${BUDGET:-300}
DIR="$OUT/moe_down_ncu"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
for case in "64 wd4_mb4 8,1,4,1,weights_direct=4" "64 wd3_mb8 8,1,8,1,weights_direct=3" \
            "128 tn16_wd2_mb6 16,1,6,1,weights_direct=2"; do
  read -r tokens label fields <<< "$case"
  [ "$(left)" -lt 70 ] && break
  ncu_down_tile "$DIR" "$label" "$tokens" "$fields"
done
