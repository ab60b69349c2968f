#!/usr/bin/env bash
# Issue 4, one H200 call: a TN=64 ring with n_step from 32 to 64 routed rows per expert (A/B table auto_w64).
#   (1) the MoE GPU tests (the TN=64 n_step extra tile bitwise against every other tile, batch-invariant)
#   (2) the layer, auto against auto_w64 in one process, two rounds in swapped arm order, T = TOKENS;
#       JSONs $DIR/layer_ab_{1,2}.json
#   (3) memcheck / racecheck on the tiny layer over every tiling
# Usage (repo root; carry .whl and .tkcache, built here by moe_prebuild.py):
#   OUT=$OUT bash profiling/run_gpu_checks_moe_tn64_band.sh -> $OUT/moe_tn64_band.tar
set -uo pipefail
OUT=${OUT:-runs/moe_tn64_band}
TOKENS=${TOKENS:-384,512,640,768,896,1024,1536}
BUDGET=${BUDGET:-400}
DIR="$OUT/moe_tn64_band"
mkdir -p "$DIR"
source profiling/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
timeout 120 python3 profiling/moe_prebuild.py --jobs 16 tiny qwen3-30b-a3b > "$DIR/build_tests.log" 2>&1
echo "test build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_tests.log"
timeout 100 python3 profiling/moe_prebuild.py --jobs 16 --tables auto,auto_w64 --no-extras qwen3-235b-a22b \
  > "$DIR/build_235b.log" 2>&1
echo "235B build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_235b.log"
gpu_tests 120 "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
arms=("auto,auto_w64" "auto_w64,auto")
for round in 1 2; do
  [ "$(left)" -lt 120 ] && break
  timeout 120 python3 profiling/bench_moe_gemm.py --variants "${arms[$((round - 1))]}" --tokens "$TOKENS" --reps 10 \
    --out "$DIR/layer_ab_$round.json" > "$DIR/layer_ab_$round.log" 2>&1
  echo "layer A/B $round (${arms[$((round - 1))]}) exit $? (${SECONDS}s)"
  python3 -c 'import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(r["shape"][6:9], r["tokens"], " ".join("%s=%.4f/%.4f/%.4f" % (k, x["nvfp4_ms"], x["nvfp4_gate_up_fused_ms"],
          x["nvfp4_down_ms"]) for k, x in sorted(r["variants"].items())))' "$DIR/layer_ab_$round.json"
done
limit=$(( ($(left) - 5) / 2 )); [ "$limit" -gt 50 ] && limit=50
[ "$limit" -gt 15 ] && moe_sanitizers "$DIR" "$limit"
