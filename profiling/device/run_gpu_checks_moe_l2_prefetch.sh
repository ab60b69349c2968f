#!/usr/bin/env bash
# Does a MoE GEMM whose weights are prefetched into L2 ahead of its PDL wait (TileConfig.l2_prefetch, sixty-third
# session) make the layer faster? Under programmatic dependent launches the down GEMM's CTAs can get resident during the
# gate_up's main loop; with l2_prefetch each warpgroup then asks the TMA unit for the rest of its weight chunks at once
# (cp.async.bulk.prefetch.L2), so the down GEMM's main loop reads them from L2 once the gate_up is done, and the
# gate_up's own CTAs have their whole slice requested at their start. Besides the v1 ws-band question of
# the ws-band call (run_gpu_sweep_moe_ws_band.sh), in one call:
#   1. the carried cache checked (moe_prebuild.py, every kernel below; builds what is missing);
#   2. the layer, decode bands: auto against auto_pfd (its v1 down decode tiles prefetching), auto_pf (both GEMMs'
#      v1 decode tiles) and auto_gd (30B's gate_up on the down GEMM's direct tile from T=2 to 16, which the ws-band
#      sweep of this session found 3-10% faster timed alone) at T = 2 .. 1024, in DIR/decode;
#   3. the layer, T <= 2 (ws tiles in auto): auto against auto_v1pf (auto_v1lo's v1 tiles, prefetching), in DIR/band;
#      both as two rounds with the arms' order reversed in the second, then two more while time is left (DIR/*2);
#   4. the GPU tests of the prefetching tiles and the fused combine (the v1_pf layer under PDL and replayed from a CUDA
#      graph, the new tables' layer bits against auto's, the fused combine), then memcheck on the v1_pf layer under PDL
#      at T=8 and the fused combine at T=1.
# Usage (repo root; carry .whl and .tkcache_pf: python profiling/prebuild_device_caches.py --cache .tkcache_pf moe_l2_prefetch):
#   OUT=$OUT [BUDGET=480] bash profiling/device/run_gpu_checks_moe_l2_prefetch.sh   -> $OUT/moe_l2_prefetch.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_l2_prefetch 480 .tkcache_pf
head -2 "$DIR/machine.log"
DECODE_ARMS=auto,auto_pfd,auto_pf,auto_gd
BAND_ARMS=auto,auto_v1pf
moe_build 90 "$DIR/build.log" --tables "$DECODE_ARMS,$BAND_ARMS" --no-extras qwen3-30b-a3b qwen3-235b-a22b
mkdir -p "$DIR/decode" "$DIR/band" "$DIR/decode2" "$DIR/band2"
layer_ab_swapped "$DIR/decode" 90 200 "$DECODE_ARMS" --tokens 2,4,8,16,32,64,256,1024
layer_ab_swapped "$DIR/band" 60 170 "$BAND_ARMS" --tokens 1,2
if [ "$(left)" -gt 100 ]; then
  gpu_tests $(( $(left) - 70 < 120 ? $(left) - 70 : 120 )) "$DIR/gpu_tests.log" tests/gpu/test_moe_gemm.py \
    -k "v1_pf or prefetch_and_direct or fused_combine"
  sanitize memcheck 35 "$DIR/memcheck_pf.log" python3 -m pytest -q -p no:cacheprovider \
    "tests/gpu/test_moe_gemm.py::test_programmatic_dependent_launches_equal_plain_ones[8-v1_pf]"
  sanitize memcheck 30 "$DIR/memcheck_combine.log" python3 -m pytest -q -p no:cacheprovider \
    "tests/gpu/test_moe_gemm.py::test_fused_combine_equals_the_combine_kernel[1]"
fi
layer_ab_swapped "$DIR/decode2" 90 110 "$DECODE_ARMS" --tokens 2,4,8,16,32,64,256,1024
layer_ab_swapped "$DIR/band2" 60 70 "$BAND_ARMS" --tokens 1,2
echo "== done ($(left)s left)"
