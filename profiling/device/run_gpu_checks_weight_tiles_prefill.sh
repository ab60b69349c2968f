#!/usr/bin/env bash
# Weight tiles in turn on the prefill ring (TileConfig.weight_tiles, thirty-seventh session), on the H200, in one call
# (BUDGET s). Nsight Compute put ~40% of the prefill down GEMM's warp samples (29% of the gate_up's) in code each CTA
# runs once (offsets scan, token rows, the ring's fill, the epilogue); with two weight tiles per CTA the first three
# are paid once per two tiles and the ring runs on through the first tile's epilogue.
#   1. the MoE GPU tests (the weight_tiles extra tiles against the reference and bitwise against every other tiling)
#   2. the layer, auto against auto_wt2 (auto's prefill ring with two weight tiles per CTA, both GEMMs), two rounds in
#      one process each, arms swapped in the second, at T=1024 (control: the same kernels) / 4096 / 16384
#   3. memcheck and racecheck on the tiny layer over every tiling (moe_sanitizers)
#   4. the prefill ring at one, two and four weight tiles per CTA (sweep_moe_gemm_tiles.py --tiles, T=4096 / 16384)
# Usage (repo root; carry .whl, .tkcache_moe): OUT=$OUT [BUDGET=560] bash profiling/device/run_gpu_checks_weight_tiles_prefill.sh
#   .tkcache_moe: python profiling/prebuild_device_caches.py --cache .tkcache_moe moe_tests, then
#   TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_moe python profiling/moe_prebuild.py --no-extras --tables auto \
#     --tiles "$(sed -n 's/^TILES=//p' profiling/device/run_gpu_checks_weight_tiles_prefill.sh | tr -d '"')" \
#     qwen3-30b-a3b qwen3-235b-a22b
#   -> $OUT/weight_tiles_prefill.tar
set -uo pipefail
OUT=${OUT:-runs/weight_tiles_prefill}
BUDGET=${BUDGET:-560}
DIR="$OUT/weight_tiles_prefill"
mkdir -p "$DIR"
export TRACE_KERNELS_CACHE_DIR=${TRACE_KERNELS_CACHE_DIR:-$PWD/.tkcache_moe}
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
TILES="tile_tokens=128,stages=2,chunks_per_stage=2,n_step=16,quantize_after=1,gather_pieces=1;tile_tokens=128,stages=2,chunks_per_stage=2,n_step=16,quantize_after=1,gather_pieces=1,weight_tiles=2;tile_tokens=128,stages=2,chunks_per_stage=2,n_step=16,quantize_after=1,gather_pieces=1,weight_tiles=4"

moe_build_ab "$DIR" auto,auto_wt2
gpu_tests 150 "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
layer_ab_swapped "$DIR" 90 100 auto,auto_wt2 --tokens 1024,4096,16384
moe_sanitizers_left "$DIR" 50
for shape in qwen3-30b-a3b qwen3-235b-a22b; do
  limit=$(( $(left) - 5 )); [ "$limit" -gt 90 ] && limit=90
  [ "$limit" -gt 20 ] || { echo "skip sweep $shape: $(left)s left"; continue; }
  timeout "$limit" python3 profiling/sweep_moe_gemm_tiles.py --shape "$shape" --tokens 4096,16384 --tiles "$TILES" \
    --reps 10 --out "$DIR/sweep_$shape.json" > "$DIR/sweep_$shape.log" 2>&1
  echo "sweep $shape exit $? (${SECONDS}s)"; grep -E "gate_up .* down " "$DIR/sweep_$shape.log" | tail -6
done
echo "== done ($(left)s left)"
