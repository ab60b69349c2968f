#!/usr/bin/env bash
# The MoE GEMMs' epilogues without a test per token column on full token tiles (fifty-ninth session).
# profiling/moe_timeline.py found the prefill CTAs 4.5-4.9 us in their epilogue (of a 22-53 us life), and the SASS
# shows why: `if (n >= rows_valid) continue;` made each of a thread's 32 token columns a branch-guarded block (BSSY /
# BRA / BSYNC), so each column's shared load, MUFU chain and store waited for the previous column's. Two ways out, same
# bits: PRED (.ab_si, the session's first form) computes every column and predicates the stores (inline PTX
# `@p st.global`); this tree drops the test where the tile is full (rows_valid >= TN) and keeps it on partly filled
# tiles. One call (BUDGET s):
#   1. the auto kernels of this tree, PRED and BASE (.ab_head: 1315f73, before both), both presets (a check of the
#      cache)
#   2. AB=1 (default): ROUNDS (6) rounds of the layer benchmark, the three trees in turn, the order rotated every round,
#      T = 1 .. 16384 (with PRED= empty: this tree and BASE, the order swapped every round)
#   3. TIMELINE=1 (default): profiling/moe_timeline.py on this tree at T = 256, 4096, 16384 (stamped cubins carried in
#      STAMPED, default .tkstamped3): the epilogue's phase and the SM time with one main loop, against the first call's
#   4. CHECKS=1 (default): the MoE GPU tests, memcheck and racecheck on the tiny fused gate_up and down GEMMs over every
#      tiling, while time is left
# Usage (repo root; carry .whl, .tkcache_hy, .ab_head, .ab_si, .tkstamped3): OUT=$OUT [BUDGET=560] bash \
#     profiling/device/run_gpu_checks_moe_full_tiles.sh
#   .ab_head: git archive 1315f73 python cuda codegen profiling/bench_moe_gemm.py profiling/sweep_moe_gemm_tiles.py
#     profiling/moe_prebuild.py | tar -x -C .ab_head; .ab_si: the same of 7b9260a (the first form; in the
#     fifty-ninth session's call it lacked sweep_moe_gemm_tiles.py and its runs failed)
#   .tkcache_hy: each tree's auto kernels (PYTHONPATH=TREE/python python profiling/moe_prebuild.py --tables auto
#     --no-extras qwen3-30b-a3b qwen3-235b-a22b with TRACE_KERNELS_CACHE_DIR=.tkcache_hy), and for CHECKS this
#     tree's `python profiling/prebuild_device_caches.py --cache .tkcache_hy moe_tests` (it keeps the newest entry of
#     each name: build the other trees' auto kernels after it)
#   .tkstamped3: python profiling/moe_timeline.py --build-only --shapes qwen3-30b-a3b,qwen3-235b-a22b
#     --stamped-dir .tkstamped3
#   -> $OUT/moe_full_tiles.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_full_tiles 560 .tkcache_hy
BASE=${BASE:-.ab_head}
PRED=${PRED-.ab_si}
TOKENS=1,8,64,256,1024,4096,16384

moe_prebuild_trees "$DIR" auto "qwen3-30b-a3b qwen3-235b-a22b" "$BASE"
if [ -n "$PRED" ]; then
  cp "$DIR/build_base.log" "$DIR/build_base_only.log"
  moe_prebuild_trees "$DIR" auto "qwen3-30b-a3b qwen3-235b-a22b" "$PRED"
  mv "$DIR/build_base.log" "$DIR/build_pred.log"; mv "$DIR/build_base_only.log" "$DIR/build_base.log"
fi
if [ "${AB:-1}" = 1 ]; then
  for round in $(seq 1 "${ROUNDS:-6}"); do
    if [ -n "$PRED" ]; then
      case $((round % 3)) in 1) order="new base pred" ;; 2) order="pred new base" ;; 0) order="base pred new" ;; esac
    else
      order="new base"; [ $((round % 2)) = 0 ] && order="base new"
    fi
    for tree in $order; do
      [ "$(left)" -lt "${AB_MIN_LEFT:-200}" ] && break 2
      case $tree in
        new | base) bench_moe_tree "$tree" "$DIR" moe_full_tiles "$round" "$TOKENS" 100 "$BASE" ;;
        pred) bench_moe_tree base "$DIR" moe_full_tiles "pred$round" "$TOKENS" 100 "$PRED" ;;  # *_basepred<round>
      esac
    done
  done
fi
STAMPED=${STAMPED:-.tkstamped3}
if [ "${TIMELINE:-1}" = 1 ] && [ "$(left)" -gt 60 ]; then
  timeout 60 python3 profiling/moe_timeline.py --tokens 256,4096,16384 --stamped-dir "$PWD/$STAMPED" \
    --out "$DIR/moe_timeline_full_tiles.json" > "$DIR/moe_timeline.log" 2>&1
  echo "moe_timeline exit $?"; grep -E "^qwen3|^  (gate_up|down)" "$DIR/moe_timeline.log" | cut -c1-230
fi
[ "${CHECKS:-1}" = 0 ] && { echo "== done ($(left)s left)"; exit 0; }
limit=$(( $(left) - 110 )); [ "$limit" -gt 200 ] && limit=200
[ "$limit" -gt 30 ] && gpu_tests "$limit" "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
moe_sanitizers_left "$DIR" 80
echo "== done ($(left)s left)"
