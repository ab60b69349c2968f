#!/usr/bin/env bash
# The MoE GEMMs' token rows without arithmetic before the first activation copies (fifty-eighth session). v1's CTAs
# have stored the source rows before those copies and the scales after them since the fifty-sixth session, but ptxas
# computed the stored product s_w * s_a ahead of the copies, so they still waited for the row scale's load; the ws
# tiles (auto's at T <= 2) loaded everything first. Now both store s_a and the router weight as loaded, after the
# copies; v1 then forms s_w * s_a in place, the ws epilogue multiplies by s_w (the same product, so the same bits).
# One call (BUDGET s):
#   1. the auto kernels of this tree and BASE (.ab_base: 0665850, before it), both presets (a check of the cache)
#   2. on an H200 (REFRESH=1, default): issue 4's whole token list, this tree, BASE and MID (.ab_mid: 5656b24, the tree
#      of the last H200 table, fifty-second session; its kernels are compiled here) in turn, three rounds with the
#      order rotated; on another card: four rounds of this tree against BASE, T = 1 .. 1024, the trees' order swapped
#      every round
#   3. the MoE GPU tests (every tiling against the reference and bitwise against the others, batch invariance, few
#      persistent ws CTAs, graphs, programmatic dependent launches)
#   4. memcheck and racecheck on the tiny fused gate_up and down GEMMs over every tiling
#   5. (not on an H200) the prefill rows (T = 4096, 16384), this tree against BASE, while 60 s are left
# Usage (repo root; carry .whl, .tkcache_rs, .ab_base, .ab_mid): OUT=$OUT [BUDGET=560] bash \
#     profiling/device/run_gpu_checks_moe_row_scales.sh
#   .ab_base / .ab_mid: git archive 0665850 / 5656b24 python cuda codegen profiling/bench_moe_gemm.py
#     profiling/sweep_moe_gemm_tiles.py profiling/moe_gemm_ncu_case.py profiling/moe_prebuild.py | tar -x -C DIR
#   .tkcache_rs: python profiling/prebuild_device_caches.py --cache .tkcache_rs moe_tests first (it keeps only the
#     newest entry of each kernel name), then BASE's auto kernels of both presets (moe_prebuild.py --tables auto
#     --no-extras qwen3-30b-a3b qwen3-235b-a22b, with PYTHONPATH=.ab_base/python and its own moe_prebuild.py)
#   (CHECKS=0: steps 1 and 2 only)
#   -> $OUT/moe_row_scales.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_row_scales 560 .tkcache_rs
BASE=${BASE:-.ab_base}
MID=${MID:-.ab_mid}
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
h200=0; [[ "$card" == *H200* && "${REFRESH:-1}" = 1 ]] && h200=1
# ab_rounds TOKENS LIMIT MIN_LEFT LABEL: four runs of this tree and BASE in turn, the order swapped every round
# (round labels LABEL1..LABEL4), while MIN_LEFT s of BUDGET are left
ab_rounds() {
  local round tree trees
  for round in 1 2 3 4; do
    trees="new base"; [ $((round % 2)) = 0 ] && trees="base new"
    for tree in $trees; do
      [ "$(left)" -lt "$3" ] && return 0
      bench_moe_tree "$tree" "$DIR" moe_row_scales "$4$round" "$1" "$2" "$BASE"
    done
  done
}

moe_prebuild_trees "$DIR" auto "qwen3-30b-a3b qwen3-235b-a22b" "$BASE"
if [ "$h200" = 1 ]; then
  cp "$DIR/build_base.log" "$DIR/build_base_only.log"
  moe_prebuild_trees "$DIR" auto "qwen3-30b-a3b qwen3-235b-a22b" "$MID"
  for round in 1 2 3; do
    case $round in 1) order="new base mid" ;; 2) order="mid new base" ;; 3) order="base mid new" ;; esac
    for tree in $order; do
      [ "$(left)" -lt 260 ] && break 2
      case $tree in
        new) bench_moe_tree new "$DIR" moe_refresh "$round" 1,8,32,64,128,256,1024,4096,16384 150 "$BASE" ;;
        base) bench_moe_tree base "$DIR" moe_refresh "$round" 1,8,32,64,128,256,1024,4096,16384 150 "$BASE" ;;
        mid) bench_moe_tree base "$DIR" moe_refresh "m$round" 1,8,32,64,128,256,1024,4096,16384 150 "$MID" ;;
      esac
    done
  done
else
  ab_rounds 1,2,8,32,64,128,256,1024 100 300 ""
fi
[ "${CHECKS:-1}" = 0 ] && { echo "== done ($(left)s left)"; exit 0; }
limit=$(( $(left) - 110 )); [ "$limit" -gt 170 ] && limit=170
[ "$limit" -gt 30 ] && gpu_tests "$limit" "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
moe_sanitizers_left "$DIR" 80
[ "$h200" = 1 ] && { echo "== done ($(left)s left)"; exit 0; }
ab_rounds 4096,16384 50 60 p
echo "== done ($(left)s left)"
