#!/usr/bin/env bash
# Issue 4, one H200 call (eleventh session of 2026-12-02): the TN=16 and TN=32 tiles' rings as 2 stages of
# 4 chunks (the down GEMM's TN=32 as 3 of 2) after run_gpu_checks_moe_rings.sh's sweep, and the same
# question for the prefill tile.
#   (1) the MoE GPU tests (every table and extra tile bitwise, batch-invariant, graphs, PDL)
#   (2) same-run A/B of the layer, this tree against BASE (.ab_base: the previous commit's python/, cuda/,
#       codegen/ and bench script), two rounds each in turn, auto table, T = 64, 128, 192, 256, 512
#   (3) the prefill tile's ring (TN=128, quantize_after as auto runs it), 30B, T = 1024, 4096, 16384
#   (4) memcheck / racecheck on the tiny layer with the time left
# Base copy (ignored by git, carried): rm -rf .ab_base && mkdir .ab_base && git archive BASE_COMMIT python cuda \
#   codegen profiling/bench_moe_gemm.py profiling/device/gpu_env.sh | tar -x -C .ab_base
# Usage (repo root; carry .whl, .tkcache and .ab_base): OUT=$OUT bash profiling/device/run_gpu_checks_moe_rings_ab.sh
set -uo pipefail
OUT=${OUT:-runs/moe_rings_ab}
BUDGET=${BUDGET:-560}
BASE=${BASE:-.ab_base}
DIR="$OUT/moe_rings_ab"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
moe_prebuild_trees "$DIR" auto "qwen3-30b-a3b qwen3-235b-a22b" "$BASE"
timeout 150 python3 profiling/moe_prebuild.py --jobs 16 tiny qwen3-30b-a3b > "$DIR/build_tests.log" 2>&1
echo "test build exit $? (${SECONDS}s)"; tail -2 "$DIR/build_tests.log"
gpu_tests 150 "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
moe_tree_ab "$DIR" moe_gemm_h200_rings 64,128,192,256,512 80 "$BASE" 120
qa="quantize_after=1"
TILES="tile_tokens=128,stages=4,$qa;tile_tokens=128,stages=2,chunks_per_stage=2,$qa;tile_tokens=128,stages=5,$qa"
TILES+=";tile_tokens=128,stages=2,chunks_per_stage=4,min_blocks=1,$qa;tile_tokens=128,stages=3,chunks_per_stage=2,min_blocks=1,$qa"
if [ "$(left)" -gt 100 ]; then
  timeout $(( $(left) - 60 )) python3 profiling/sweep_moe_gemm_tiles.py --shape qwen3-30b-a3b --tokens 1024,4096,16384 \
    --kinds gate_up_swiglu,down_routed --tiles "$TILES" --reps 5 --out "$DIR/moe_prefill_rings.json" \
    > "$DIR/sweep_prefill.log" 2>&1
  echo "prefill sweep exit $? (${SECONDS}s)"
  grep -E "^T=" "$DIR/sweep_prefill.log" | grep -v best \
    | sed -E 's/TileConfig\(tile_tokens=([0-9]+), stages=([0-9]+), min_blocks=([0-9]+).*chunks_per_stage=([0-9]+).*\)/tn\1 st\2 mb\3 cps\4/'
fi
limit=$(( ($(left) - 5) / 2 )); [ "$limit" -gt 60 ] && limit=60
[ "$limit" -gt 15 ] && moe_sanitizers "$DIR" "$limit"
