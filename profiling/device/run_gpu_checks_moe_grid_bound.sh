#!/usr/bin/env bash
# The MoE GEMMs' grid on the tighter token-tile bound (thirty-ninth session: moe_routing.token_tile_bound,
# (M + min(E, M) (TN - 1)) / TN instead of ceil(M / TN) + E; at T=64 on 128 experts 176 token tiles instead of 192,
# ~128 holding rows), checked and timed in one call (BUDGET s):
#   1. the layer at decode sizes, auto (the new bound) against auto:loose (the bound before) and auto:exact (the
#      routing's real token tiles, read on the host: what no surplus CTA at all would give), two rounds in one
#      process each, arms in reverse order in the second; T=1024 is the control (few surplus tiles there)
#   2. the MoE GPU tests (test_grid_at_its_bound_computes_every_tile: routings whose tiles equal the bound, every
#      tiling) and the RL layer's GPU tests (the engine's GEMMs launch on the bound)
#   3. memcheck and racecheck on the tiny layer over every tiling (moe_sanitizers_left)
# Usage (repo root; carry .whl, .tkcache_moe): TRACE_KERNELS_BENCH_COMMIT=<commit> OUT=$OUT [BUDGET=560] \
#     bash profiling/device/run_gpu_checks_moe_grid_bound.sh
#   .tkcache_moe: python profiling/prebuild_device_caches.py --cache .tkcache_moe moe_tests engine
#   -> $OUT/moe_grid_bound.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_grid_bound 560

moe_build_ab "$DIR" auto
prebuild_engine_test_models 60 "$DIR/build_engine.log"; echo "build_engine exit $? (${SECONDS}s)"
layer_ab_round "$DIR" 1 110 --variants auto,auto:loose,auto:exact --tokens 1,2,8,32,64,128,256,1024
limit=$(( $(left) - 300 )); [ "$limit" -gt 150 ] && limit=150
[ "$limit" -gt 30 ] && gpu_tests "$limit" "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
[ "$(left)" -gt 240 ] && layer_ab_round "$DIR" 2 110 --variants auto:exact,auto:loose,auto --tokens 1,2,8,32,64,128,256,1024
limit=$(( $(left) - 110 )); [ "$limit" -gt 100 ] && limit=100
[ "$limit" -gt 30 ] && gpu_tests "$limit" "$DIR/rl_gpu_tests.log" -m gpu tests/rl
moe_sanitizers_left "$DIR" 50
echo "== done ($(left)s left)"
