#!/usr/bin/env bash
# Where the MoE layer's GEMM time goes, per CTA (fifty-ninth session): the v1 GEMMs and the combine rebuilt with
# TRACE_KERNELS_CTA_TIMELINE (cta_timeline.cuh), whose thread 0 stamps %globaltimer at each CTA's phases. One call
# (BUDGET s):
#   1. the timeline's tests: on tiny (T = 16, 64, 600) the stamped builds give the normal build's bits (outputs
#      poisoned first) and every CTA's stamps are in order, one CTA per (token tile, weight tile); the CPU summary tests
#   2. profiling/moe_timeline.py on both presets at T = 8, 64, 256, 4096, 16384: per GEMM the phases' medians, the share
#      of SM time with 0, 1, 2, ... CTAs in their main loops, how often a CTA's neighbours run their main loops while it
#      is outside its own, the SMs' idle tails
# Any card: the prefill GEMMs are bound by the SMs, which the H100 and the H200 share; the decode GEMMs' phases follow
# DRAM, so a card's name goes with its numbers.
# Usage (repo root; carry .whl, .tkcache_tl, .tkstamped): OUT=$OUT [BUDGET=300] bash \
#     profiling/device/run_gpu_checks_moe_timeline.sh
#   .tkcache_tl: TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_tl python profiling/moe_prebuild.py --tables auto --no-extras
#     tiny qwen3-30b-a3b qwen3-235b-a22b (the normal builds)
#   .tkstamped: python profiling/moe_timeline.py --build-only --shapes tiny,qwen3-30b-a3b,qwen3-235b-a22b
#     --stamped-dir .tkstamped (the stamped builds)
#   (TOKENS, SHAPES: other cases for step 2)
#   -> $OUT/moe_timeline.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_timeline 300 .tkcache_tl
export TRACE_KERNELS_TIMELINE_CUBINS=$PWD/.tkstamped
gpu_tests 120 "$DIR/timeline_tests.log" tests/gpu/test_moe_timeline.py tests/test_profiling_moe_timeline.py
timeout $(( $(left) - 15 )) python3 profiling/moe_timeline.py --shapes "${SHAPES:-qwen3-30b-a3b,qwen3-235b-a22b}" \
  --tokens "${TOKENS:-8,64,256,4096,16384}" --stamped-dir "$TRACE_KERNELS_TIMELINE_CUBINS" \
  --out "$DIR/moe_timeline.json" > "$DIR/moe_timeline.log" 2>&1
echo "moe_timeline exit $?"; grep -v "^timeline build" "$DIR/moe_timeline.log" | tail -40
echo "== done ($(left)s left)"
