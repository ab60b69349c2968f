#!/usr/bin/env bash
# Issue 4 benchmark method, one H200 call: does the untimed first pass of bench_moe_gemm.py (its default; off with
# --no-warm-point) remove the first arm's slowdown at a process's first T? 30B at T=64 runs the same kernels in
# auto and auto_ns0 (TN=8), so the two arms should agree; two rounds of each mode, JSONs $DIR/{cold,warm}_R.json.
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_moe_bench_warm.sh
set -uo pipefail
OUT=${OUT:-runs/moe_bench_warm}
BUDGET=${BUDGET:-200}
DIR="$OUT/moe_bench_warm"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
for round in 1 2; do
  for mode in cold warm; do
    [ "$(left)" -lt 40 ] && break
    flag=(); [ "$mode" = cold ] && flag=(--no-warm-point)
    timeout 60 python3 profiling/bench_moe_gemm.py --shapes qwen3-30b-a3b --tokens 64,256 --variants auto,auto_ns0 \
      --reps 10 "${flag[@]}" --out "$DIR/${mode}_$round.json" > "$DIR/${mode}_$round.log" 2>&1
    echo "$mode $round exit $? (${SECONDS}s)"
    python3 -c 'import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(r["tokens"], " ".join("%s=%.4f" % (k, x["nvfp4_ms"]) for k, x in r["variants"].items()))' "$DIR/${mode}_$round.json"
  done
done
