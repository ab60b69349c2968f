#!/usr/bin/env bash
# Issue 5, one H200 call after run_gpu_checks_kv_gather.sh (every step under `timeout`, BUDGET s):
#   (0) the rollout engine's GPU tests (with PagedAttention building its slot table only for the torch gather, reverted
#       since: see profiling/results/kv_gather_final_h200_checks.log)
#   (1) bench_attention.py --extend-only, twice: kv_gather's bandwidth, and extend_attention against SDPA timed eagerly
#       and as CUDA-graph replays (the GPU's time without the Python work between launches)
#   (2) bench_rollout.py --quick, NVFP4 without capture: prefill attention on kv_gather (arm nvfp4:off:graphs) against
#       the torch gather (nokv: the paged-KV kernels off, decode and prefill), two rounds in swapped arm order
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_kv_gather_final.sh
#   -> $OUT/kv_gather_final.tar
set -uo pipefail
OUT=${OUT:-runs/kv_gather_final}
BUDGET=${BUDGET:-500}
DIR="$OUT/kv_gather_final"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
gpu_tests 90 "$DIR/engine_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_engine_kernels.py
for round in 1 2; do
  timeout 90 python3 profiling/bench_attention.py --extend-only --out "$DIR/kv_gather_$round.json" \
    > "$DIR/bench_$round.log" 2>&1
  echo "bench $round exit $? (${SECONDS}s)"; grep -E "^kv_gather.*items=1|^extend" "$DIR/bench_$round.log" | cut -c1-220
done
arms=(nvfp4:off:graphs,nvfp4:off:graphs:nokv nvfp4:off:graphs:nokv,nvfp4:off:graphs)
for round in 1 2; do
  limit=$(( ($(left) - 10) / (3 - round) ))
  timeout "$limit" python3 profiling/bench_rollout.py --quick --arms "${arms[$((round - 1))]}" --generate-reps 3 \
    --out "$DIR/rollout_prefill_$round.json" > "$DIR/rollout_$round.log" 2>&1
  echo "rollout $round exit $? (${SECONDS}s)"; grep -E "prefill .* tok/s" "$DIR/rollout_$round.log" | cut -c1-200
done
