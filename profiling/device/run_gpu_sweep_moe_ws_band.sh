#!/usr/bin/env bash
# Is ws still the faster tile below 1/8 routed row per expert (auto's band at T <= 2 of top-8 over 128 experts)? The
# ws tiles won it in the eleventh and twelfth sessions (2026-12-02); v1's CTA start has been shortened since (fifty-fifth
# to fifty-eighth sessions) and its decode tiles keep their rows in registers. One sweep per preset at T = 1, 2, 4 (T=4:
# v1's band, a reference) of the fused gate_up and down + combine GEMMs: auto's two ws tiles, v1's TN=8 ring and direct
# tiles quantized afterwards (auto's from T=4) or in their last CTA from the folded row amax (row_amax), and v1's
# one-warpgroup ring with row_amax. CUDA-graph replays, L2 flushed, median of REPS. First (AB=1, default) the layer,
# auto against auto_v1lo (auto without its ws band: auto's T=4 tiles from T=1 on) at T = 1, 2, 4 (T=4 the same kernels,
# a control) and auto_v1cb (auto_v1lo with the down GEMM combining in its epilogue at T <= 4), two rounds in one process
# each with the arms' order reversed; then the sweeps while 40 s are left.
# Then (CHECKS=1, default) the fused combine's GPU test (at T = 1, 8, 300, against the combine kernel) and memcheck on
# its T=1 case, which auto_v1cb would need before it is adopted.
# Usage (repo root; carry .whl and .tkcache_moe: prebuild_device_caches.py --cache .tkcache_moe moe_tests, then into the
# same cache moe_prebuild.py --tables auto,auto_v1cb --no-extras --tiles "$TILES" qwen3-30b-a3b qwen3-235b-a22b):
#   OUT=$OUT [BUDGET=300] bash profiling/device/run_gpu_sweep_moe_ws_band.sh   -> $OUT/moe_ws_band.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_ws_band 300 .tkcache_moe
TILES="tile_tokens=8,stages=5,min_blocks=3,warpgroups=1,variant=ws,chunks_per_stage=2,row_amax=1;\
tile_tokens=8,stages=5,min_blocks=2,warpgroups=2,variant=ws,chunks_per_stage=2;\
tile_tokens=8,stages=2,chunks_per_stage=4,fused_min_blocks=4,quantize_after=1;\
tile_tokens=8,stages=2,chunks_per_stage=4,fused_min_blocks=4,row_amax=1;\
tile_tokens=8,stages=1,min_blocks=8,warpgroups=1,weights_direct=3,quantize_after=1;\
tile_tokens=8,stages=1,min_blocks=8,warpgroups=1,weights_direct=3,row_amax=1;\
tile_tokens=8,stages=4,min_blocks=4,warpgroups=1,row_amax=1"
[ "${AB:-1}" = 1 ] && layer_ab_swapped "$DIR" 90 60 auto,auto_v1lo,auto_v1cb --tokens 1,2,4
if [ "${CHECKS:-1}" = 1 ] && [ "$(left)" -gt 100 ]; then
  gpu_tests 60 "$DIR/fused_combine_tests.log" tests/gpu/test_moe_gemm.py -k test_fused_combine_equals_the_combine_kernel
  sanitize memcheck 40 "$DIR/fused_combine_memcheck.log" python3 -m pytest -q -p no:cacheprovider \
    "tests/gpu/test_moe_gemm.py::test_fused_combine_equals_the_combine_kernel[1]"
fi
shares=2
for shape in qwen3-30b-a3b qwen3-235b-a22b; do
  [ "$(left)" -lt 40 ] && break
  timeout $(( ($(left) - 10) / shares )) python3 profiling/sweep_moe_gemm_tiles.py --shape "$shape" --tokens "${TOKENS:-1,2,4}" \
    --tiles "$TILES" --reps "${REPS:-20}" --out "$DIR/sweep_${shape}.json" > "$DIR/sweep_${shape}.log" 2>&1
  echo "$shape sweep exit $? (${SECONDS}s)"; grep -E "^T=" "$DIR/sweep_${shape}.log" | sed 's/tile_tokens=8,//'
  shares=1
done
echo "== done ($(left)s left)"
