#!/usr/bin/env bash
# The MoE prefill tiles again, after the v1 rings learned to gather whole activation pieces (thirty-fourth session), in
# one call (BUDGET s): sweep_moe_gemm_tiles.py --tiles at T=4096 and 16384 on Qwen3-30B-A3B and Qwen3-235B-A22B, every
# tile timed as the fused gate_up (quantized afterwards) and as the down GEMM + combine:
#   A  v1 TN=128, 2 stages of 2 chunks, gathering whole pieces: auto's gate_up tile; as the down GEMM's not timed before
#      this sweep (auto's down tile since, thirty-sixth session)
#   B  ws TN=128, two m-tiles: auto's down tile from 2026-12-02 until this sweep (auto_dws's since); as the gate_up's
#      (h only, then the quantize kernel) not timed before
#   C  ws TN=128, overlapped main loop (the ws table's prefill tile), quantized afterwards
# (The call that produced moe_prefill_tiles_gp_h100_*.json then gave a racecheck of the 30B T=300 gate_up / down tests
# the 10 s left; that racecheck is run_gpu_checks_down_prefill_ab.sh's now.)
# TILES overrides the three (sweep_moe_gemm_tiles.py --tiles form), e.g. for the four-warpgroup prefill ring of EXTRA_TILES
# against auto's two-warpgroup ring (not yet run):
#   TILES="tile_tokens=128,stages=2,chunks_per_stage=2,n_step=16,quantize_after=1,gather_pieces=1;\
#          tile_tokens=128,stages=4,min_blocks=1,warpgroups=4,chunks_per_stage=2,n_step=16,quantize_after=1,gather_pieces=1;\
#          tile_tokens=128,stages=3,min_blocks=1,warpgroups=4,chunks_per_stage=2,n_step=16,quantize_after=1,gather_pieces=1"
# Usage (repo root; carry .whl, .tkcache_moe): OUT=$OUT [BUDGET=560] [TILES=...] bash profiling/device/run_gpu_checks_prefill_tiles.sh
#   -> $OUT/prefill_tiles.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call prefill_tiles 560

TILES=${TILES:-"tile_tokens=128,stages=2,chunks_per_stage=2,n_step=16,quantize_after=1,gather_pieces=1;\
tile_tokens=128,stages=4,min_blocks=1,warpgroups=2,variant=ws,m_tiles=2,quantize_after=1;\
tile_tokens=128,stages=4,min_blocks=1,warpgroups=2,overlap=1,variant=ws,quantize_after=1"}
TILES=$(tr -d ' \n' <<< "$TILES")  # (the usage example above spans lines)
for shape in qwen3-30b-a3b qwen3-235b-a22b; do
  [ "$(left)" -gt 100 ] || { echo "skip $shape: $(left)s left"; continue; }
  limit=$(( $(left) - 10 )); [ "$limit" -gt 180 ] && limit=180
  moe_sweep "$DIR/prefill_tiles_$shape.json" "$DIR/sweep_$shape.log" "$limit" --shape "$shape" --tokens 4096,16384 \
    --tiles "$TILES"
done
echo "== done ($(left)s left)"
