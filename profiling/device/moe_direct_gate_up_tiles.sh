# Sweep bands of run_gpu_checks_moe_direct_gate_up.sh: the fused gate_up (quantize_after, as auto runs it) on direct
# tiles with their registers capped by min_blocks, against auto's ring tiles. Its K = H keeps TN x H x 2 bytes of
# activations resident per CTA (30B 32 KB at TN=8: 6 CTAs/SM at most; 235B 64 KB: 3). Sourced, also for the local
# prebuild (moe_prebuild.py --tiles "$UP8_30B;$UP8_235B").
qa=quantize_after=1
ring8_1wg="tile_tokens=8,stages=4,min_blocks=4,warpgroups=1,$qa"
ring8="tile_tokens=8,stages=2,chunks_per_stage=4,fused_min_blocks=4,$qa"
d8="tile_tokens=8,stages=1,warpgroups=1,$qa"
d8_2wg="tile_tokens=8,stages=1,warpgroups=2,$qa"
UP8_30B="$ring8_1wg;$ring8;$d8,min_blocks=4,weights_direct=4;$d8,min_blocks=6,weights_direct=2;$d8,min_blocks=6,weights_direct=3;$d8_2wg,min_blocks=3,weights_direct=2;$d8_2wg,min_blocks=3,weights_direct=3"
UP8_235B="$ring8_1wg;$ring8;$d8,min_blocks=3,weights_direct=2;$d8,min_blocks=3,weights_direct=4"
BANDS_30B=("8,32,64|gate_up_swiglu|$UP8_30B")
BANDS_235B=("8,32,64|gate_up_swiglu|$UP8_235B")
# Below 1/8 routed row per expert (T = 1-2 at top-8 of 128 experts) a few hundred CTAs cover every weight tile, so
# the bytes in flight per CTA set the speed, not occupancy: direct tiles many chunks ahead at 1-2 CTAs/SM (up to
# 255 registers) against auto's ws tiles, both GEMMs (the fused gate_up as each tile launches it).
ws_up="tile_tokens=8,stages=5,min_blocks=3,warpgroups=1,variant=ws,chunks_per_stage=2"
ws_down="tile_tokens=8,stages=5,min_blocks=2,warpgroups=2,variant=ws,chunks_per_stage=2"
dd="tile_tokens=8,stages=1,warpgroups=1"
DEEP="$dd,min_blocks=1,weights_direct=8;$dd,min_blocks=1,weights_direct=12;$dd,min_blocks=1,weights_direct=16;$dd,min_blocks=2,weights_direct=6"
DEEP_QA="$dd,min_blocks=1,weights_direct=8,$qa;$dd,min_blocks=1,weights_direct=12,$qa;$dd,min_blocks=1,weights_direct=16,$qa;$dd,min_blocks=2,weights_direct=6,$qa"
BANDS_T1=("1,2,4|gate_up_swiglu|$ws_up;$DEEP_QA;$DEEP" "1,2,4|down_routed|$ws_down;$DEEP")
