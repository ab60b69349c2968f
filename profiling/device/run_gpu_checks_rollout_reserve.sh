#!/usr/bin/env bash
# After PinnedSlabPool.reserve learned about slab tails (seventh session of 2026-12-02): the engine's GPU
# tests, then bench_rollout --quick with 4 full generates per arm (first_generate reported apart; each
# generate's slowest decode step and new cudaMalloc segments in the JSON). Expect the compact-capture
# arm's first generate without the ~125 ms step where a pinned slab was allocated mid-decode.
# Usage (repo root; carry .whl): OUT=$OUT bash profiling/device/run_gpu_checks_rollout_reserve.sh -> $OUT/rollout_reserve.tar
set -uo pipefail
OUT=${OUT:-runs/rollout_reserve}
BUDGET=${BUDGET:-480}
DIR="$OUT/rollout_reserve"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 150 python3 profiling/prebuild_engine_kernels.py "E=8,H=64,I=64,k=2,hq=4,hkv=2,hd=64:1,8,40" \
  "E=32,H=512,I=256,k=4,hq=8,hkv=2,hd=64:1,8,40" qwen3-30b-a3b:2,64,16384 > "$DIR/build.log" 2>&1
echo "prebuild exit $? (${SECONDS}s)"; grep -E "FAILED|built" "$DIR/build.log" | tail -3
gpu_tests 150 "$DIR/engine_gpu_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_engine.py -m gpu
timeout $(( $(left) - 10 )) python3 profiling/bench_rollout.py --quick --generate-reps 4 --time-budget 200 \
  --out "$DIR/rollout_h200_quick_reserve.json" > "$DIR/bench.log" 2>&1
echo "bench exit $?"; tail -6 "$DIR/bench.log"
python3 - "$DIR/rollout_h200_quick_reserve.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    g = [r["first_generate"]] + r["later_generates"]
    print(r["mode"], r["capture"], "graphs" if r["graphs"] else "eager", "kv" if r["kv_kernels"] else "nokv",
          "step ms mean/max per generate:", [(round(x["decode_step_ms"], 3), round(x["decode_step_ms_max"], 1)) for x in g])
PY
