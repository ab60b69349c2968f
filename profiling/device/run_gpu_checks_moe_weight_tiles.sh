#!/usr/bin/env bash
# Issue 4, one H200 call (twelfth session of 2026-12-02): v1 weight tiles in turn (TileConfig.weight_tiles:
# one K ring through several weight tiles per CTA, so the offsets scan, token rows and ring fill happen once
# per CTA), at decode, where the 30B down GEMM (12 K chunks per CTA) streams at ~58% of copy.
#   (1) the MoE GPU tests (the new extra tiles bitwise against every other tile, batch invariance, graphs)
#   (2) sweep_moe_gemm_tiles.py --tiles: each decode table tile at 1-8 weight tiles per CTA, down GEMM and
#       fused gate_up (quantize_after, as auto runs it) timed apart, both presets
#   (3) memcheck / racecheck on the tiny layer over every tiling
# Ran at 8f30b04 (moe_weight_tiles_h200.json); the next commit removed weight_tiles, so it needs that commit.
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_moe_weight_tiles.sh
set -uo pipefail
OUT=${OUT:-runs/moe_weight_tiles}
BUDGET=${BUDGET:-560}
DIR="$OUT/moe_weight_tiles"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
timeout 150 python3 profiling/moe_prebuild.py --jobs 16 tiny qwen3-30b-a3b > "$DIR/build_tests.log" 2>&1
echo "test build exit $? (${SECONDS}s)"; tail -2 "$DIR/build_tests.log"
gpu_tests 170 "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
# tiles per band: "TOKENS|KINDS|TILES" (TILES as sweep_moe_gemm_tiles.py --tiles takes them, WT = weight_tiles)
wt() { local base=$1 out="" n; shift; for n in "$@"; do out+="$base,weight_tiles=$n;"; done; echo "$out"; }
one_wg="tile_tokens=8,stages=4,min_blocks=4,warpgroups=1"
tn8="tile_tokens=8,stages=2,chunks_per_stage=4,fused_min_blocks=4"
tn16="tile_tokens=16,stages=2,chunks_per_stage=4,fused_min_blocks=4"
tn32="tile_tokens=32,stages=2,chunks_per_stage=4,fused_min_blocks=4"
tn32_down="tile_tokens=32,stages=3,chunks_per_stage=2,fused_min_blocks=4"
qa=quantize_after=1
BANDS_30B=("8,32,64|down_routed|$(wt $one_wg 1 2 4 8)$(wt "$one_wg,stages=3,chunks_per_stage=2" 2 4)$(wt "$one_wg,stages=6" 2 4)"
           "128,256,512|down_routed|$(wt tile_tokens=16,stages=3,chunks_per_stage=2 1 2)$(wt $tn32_down 1 2 4)"
           "8,32,64|gate_up_swiglu|$(wt $one_wg,$qa 1 2 4)$(wt $tn8,$qa 1 2 3 4)"
           "128,256,512|gate_up_swiglu|$(wt $tn16,$qa 1 2)$(wt $tn32,$qa 1 2)")
BANDS_235B=("8,32,64|down_routed|$(wt $one_wg 1 2 4)$(wt $tn8 1 2 4)"
            "128,256|down_routed|$(wt $tn16 1 2)$(wt $tn32_down 1 2)"
            "8,32,64|gate_up_swiglu|$(wt $one_wg,$qa 1 2 4)$(wt $tn8,$qa 1 2 4)"
            "128,256|gate_up_swiglu|$(wt $tn16,$qa 1 2)$(wt $tn32,$qa 1 2)")
sweep_bands "$DIR" weight_tiles qwen3-30b-a3b "${BANDS_30B[@]}"
sweep_bands "$DIR" weight_tiles qwen3-235b-a22b "${BANDS_235B[@]}"
# Nsight Compute on the 30B down GEMM at T=64: the table's one-warpgroup tile (EXTRA_TILES[0]), then 4 weight
# tiles per CTA
wt4=$(python3 -c "import dataclasses as d; from trace_kernels.codegen.ops import moe_gemm as c
print(c.EXTRA_TILES.index(d.replace(c.V1_ONE_WARPGROUP_DECODE_TILE, weight_tiles=4)))" 2>/dev/null)
for case in "wt1 --extra=0 moe_gemm_down_routed_\\w+_tn8_st4_mb4_wg1_pf1_ov0_sm90a" \
            "wt4 --extra=$wt4 moe_gemm_down_routed_\\w+_wt4_sm90a"; do
  read -r label arg regex <<< "$case"
  [ "$(left)" -lt 200 ] && break
  ncu_report "$DIR/ncu_down_t64_$label" 60 "$regex" \
    python3 profiling/moe_gemm_ncu_case.py --shape qwen3-30b-a3b --tokens 64 --repeat 1 $arg
done
limit=$(( ($(left) - 5) / 2 )); [ "$limit" -gt 60 ] && limit=60
[ "$limit" -gt 15 ] && moe_sanitizers "$DIR" "$limit"
