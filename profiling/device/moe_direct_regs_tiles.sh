# Sweep bands and layer A/B tiles of run_gpu_checks_moe_direct_regs.sh: the down GEMM's direct tiles with their
# registers capped by min_blocks (6: 85, 8: 64 per thread; 4: ptxas's 77-80) so more CTAs share an SM.
# Sourced, also for the local prebuild (moe_prebuild.py --tiles "$DOWN8;$DOWN16").
ring8_1wg="tile_tokens=8,stages=4,min_blocks=4,warpgroups=1"
ring8="tile_tokens=8,stages=2,chunks_per_stage=4,fused_min_blocks=4"
ring16="tile_tokens=16,stages=2,chunks_per_stage=4,fused_min_blocks=4"
d8="tile_tokens=8,stages=1,warpgroups=1"
d16="tile_tokens=16,stages=1,warpgroups=1"
# the direct candidates, in the order the layer A/B's auto:downJ arms run them
DIRECT8="$d8,min_blocks=4,weights_direct=2;$d8,min_blocks=6,weights_direct=2;$d8,min_blocks=6,weights_direct=4;$d8,min_blocks=8,weights_direct=1;$d8,min_blocks=8,weights_direct=2;$d8,min_blocks=8,weights_direct=3"
DIRECT16="$d16,min_blocks=4,weights_direct=4;$d16,min_blocks=4,weights_direct=2;$d16,min_blocks=6,weights_direct=2"
DOWN8="$ring8_1wg;$ring8;$d8,min_blocks=4,weights_direct=4;$DIRECT8"
DOWN16="$ring16;$DIRECT16"
BANDS_30B=("8,32,64|down_routed|$DOWN8" "128,192|down_routed|$DOWN16")
BANDS_235B=("8,32,64|down_routed|$DOWN8")
