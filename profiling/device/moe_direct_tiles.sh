# Sweep bands of run_gpu_checks_moe_direct.sh ("TOKENS|KINDS|TILES", TILES as sweep_moe_gemm_tiles.py --tiles
# takes them); sourced, also for the local prebuild (moe_prebuild.py --tiles, docs/moe_gemm.md).
one_wg="tile_tokens=8,stages=4,min_blocks=4,warpgroups=1"
tn8="tile_tokens=8,stages=2,chunks_per_stage=4,fused_min_blocks=4"
tn16="tile_tokens=16,stages=2,chunks_per_stage=4,fused_min_blocks=4"
tn32="tile_tokens=32,stages=2,chunks_per_stage=4,fused_min_blocks=4"
tn32_down="tile_tokens=32,stages=3,chunks_per_stage=2,fused_min_blocks=4"
d8_1wg="tile_tokens=8,stages=1,min_blocks=4,warpgroups=1"
d8_2wg="tile_tokens=8,stages=1,min_blocks=2,warpgroups=2"
d16_2wg="tile_tokens=16,stages=1,min_blocks=2,warpgroups=2"
d16_1wg="tile_tokens=16,stages=1,min_blocks=4,warpgroups=1"
qa=quantize_after=1
DECODE8="$one_wg;$tn8;$d8_1wg,weights_direct=2;$d8_1wg,weights_direct=4;$d8_1wg,weights_direct=8;$d8_2wg,weights_direct=4;$d8_2wg,min_blocks=3,weights_direct=4"
DECODE8_QA="$one_wg,$qa;$tn8,$qa;$d8_1wg,weights_direct=2,$qa;$d8_1wg,weights_direct=4,$qa;$d8_1wg,weights_direct=8,$qa;$d8_2wg,weights_direct=4,$qa;$d8_2wg,min_blocks=3,weights_direct=4,$qa"
WIDE="$tn16;$tn32_down;$d16_2wg,weights_direct=4;$d16_1wg,weights_direct=4"
WIDE_QA="$tn16,$qa;$tn32,$qa;$d16_2wg,weights_direct=4,$qa;$d16_1wg,weights_direct=4,$qa"
WIDE_30B=";tile_tokens=32,stages=1,min_blocks=1,warpgroups=2,weights_direct=4"
BANDS_30B=("8,32,64|down_routed|$DECODE8" "128,256|down_routed|$WIDE$WIDE_30B"
           "8,32,64|gate_up_swiglu|$DECODE8_QA" "128,256|gate_up_swiglu|$WIDE_QA$WIDE_30B,$qa")
BANDS_235B=("8,32,64|down_routed|$DECODE8" "128,256|down_routed|$WIDE"
            "8,32,64|gate_up_swiglu|$DECODE8_QA" "128,256|gate_up_swiglu|$WIDE_QA")
