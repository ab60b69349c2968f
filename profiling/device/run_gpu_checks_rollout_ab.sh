#!/usr/bin/env bash
# bench_rollout --quick of BASE (a carried copy of an earlier commit's tree: python/, rl/, cuda/, codegen/,
# profiling/) and of this tree, in turn, ROUNDS times, one call: the end-to-end A/B of kernel changes
# (the arms of one tree are unpaired and spread run to run, so the trees alternate in the same call).
# Each tree's engine kernels (qwen3-30b-a3b) are built first, both trees at once, into separate caches.
# BENCH_ARGS (default "--quick --generate-reps 4") picks the comparison, e.g. long outputs:
#   BENCH_ARGS="--prompt-lens '' --long-outputs 32768 --long-arms nvfp4:off --max-batch 1024 --mem-fraction 0.8"
# Usage (repo root; carry .whl and BASE): OUT=$OUT BASE=.ab_base bash profiling/device/run_gpu_checks_rollout_ab.sh
#   -> $OUT/rollout_ab.tar
set -uo pipefail
OUT=${OUT:-runs/rollout_ab}
BUDGET=${BUDGET:-500}
BASE=${BASE:-.ab_base}
DIR="$OUT/rollout_ab"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/setup.log"
tree_env() {  # tree_env TREE CMD...: CMD with TREE's package, RL layer and JIT cache
  if [ "$1" = base ]; then
    shift; PYTHONPATH=/tmp/site:$PWD/$BASE/python:$PWD/$BASE/rl TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_base "$@"
  else
    shift; "$@"
  fi
}
script() { [ "$1" = base ] && echo "$BASE/profiling/$2" || echo "profiling/$2"; }

for tree in base new; do
  tree_env $tree timeout 170 python3 "$(script $tree prebuild_engine_kernels.py)" qwen3-30b-a3b:2,64,16384 \
    > "$DIR/build_$tree.log" 2>&1 &
done
wait; echo "prebuilds done (${SECONDS}s)"; tail -qn1 "$DIR"/build_*.log

for round in $(seq 1 "${ROUNDS:-2}"); do
  for tree in base new; do
    limit=$(( $(left) > 110 ? 100 : $(left) - 10 ))
    [ "$limit" -lt 40 ] && { echo "$tree $round: skipped, $(left)s left"; continue; }
    eval "tree_env $tree timeout $limit python3 $(script $tree bench_rollout.py) ${BENCH_ARGS:---quick --generate-reps 4} \
      --time-budget $((limit - 20)) --out $DIR/rollout_${tree}${round}.json" > "$DIR/bench_${tree}${round}.log" 2>&1
    echo "$tree $round exit $? (${SECONDS}s)"
    grep -E "graphs \[(kernels|reference), kv-kernels\]|^long|output" "$DIR/bench_${tree}${round}.log" | sed -E 's/, prefill.*//; s/ +/ /g' | tail -6
  done
done
