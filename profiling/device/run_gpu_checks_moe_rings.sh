#!/usr/bin/env bash
# Issue 4, one H200 call (eleventh session of 2026-12-02): why the TN=16 / TN=32 decode tiles (8-32 routed
# rows per expert, T = 128-512) move the same weight bytes 5-28% slower than TN=8 does at T=64.
#   (1) the ring shapes of those tiles (stages x chunks per stage, one or two warpgroups), quantize_after
#       as auto runs them: sweep_moe_gemm_tiles.py --tiles, fused gate_up and down timed apart, both presets
#   (2) Nsight Compute on the plain gate_up at T=64 (TN=8) and T=256 (TN=32) and the down GEMM at T=256
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_moe_rings.sh
set -uo pipefail
OUT=${OUT:-runs/moe_rings}
BUDGET=${BUDGET:-560}
DIR="$OUT/moe_rings"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
qa="quantize_after=1"
TILES="tile_tokens=16,stages=4,chunks_per_stage=2,$qa;tile_tokens=16,stages=2,chunks_per_stage=4,$qa"
TILES+=";tile_tokens=16,stages=8,$qa;tile_tokens=16,stages=4,chunks_per_stage=2,warpgroups=1,min_blocks=4,$qa"
TILES+=";tile_tokens=32,stages=6,$qa;tile_tokens=32,stages=3,chunks_per_stage=2,$qa"
TILES+=";tile_tokens=32,stages=4,chunks_per_stage=2,$qa;tile_tokens=32,stages=2,chunks_per_stage=4,$qa"
TILES+=";tile_tokens=32,stages=8,$qa;tile_tokens=32,stages=6,warpgroups=1,min_blocks=4,$qa"
TILES+=";tile_tokens=32,stages=3,chunks_per_stage=2,warpgroups=1,min_blocks=4,$qa"
for shape in qwen3-30b-a3b qwen3-235b-a22b; do
  tokens=128,192,256,512; [ "$shape" = qwen3-235b-a22b ] && tokens=128,256
  timeout 150 python3 profiling/sweep_moe_gemm_tiles.py --shape "$shape" --tokens "$tokens" \
    --kinds gate_up_swiglu,down_routed --tiles "$TILES" --reps 10 --out "$DIR/moe_rings_$shape.json" \
    > "$DIR/sweep_$shape.log" 2>&1
  echo "sweep $shape exit $? (${SECONDS}s)"; grep -E "best" "$DIR/sweep_$shape.log"
done
for case in "64 gate_up_tn8 moe_gemm_gate_up_nvfp4_e128_h2048_i768_tn8_sm90a" \
            "256 gate_up_tn32 moe_gemm_gate_up_nvfp4_e128_h2048_i768_tn32_sm90a" \
            "256 down_tn32 moe_gemm_down_routed_nvfp4_e128_h2048_i768_tn32_sm90a"; do
  read -r tokens label regex <<< "$case"
  [ "$(left)" -lt 60 ] && break
  ncu_report "$DIR/ncu_t${tokens}_$label" 60 "$regex" \
    python3 profiling/moe_gemm_ncu_case.py --shape qwen3-30b-a3b --tokens "$tokens" --plain --repeat 1
done
