#!/usr/bin/env bash
# Why a compact-capture arm's first full-length generates decode slower (seventh session of 2026-12-02):
# the capture-off and compact arms, 5 full generates each, with per-generate decode-step median / max,
# capture host seconds, new cudaMalloc segments and Python GC seconds (bench_rollout's first_generate /
# later_generates).
# Usage (repo root; carry .whl): OUT=$OUT bash profiling/device/run_gpu_checks_rollout_first.sh -> $OUT/rollout_first.tar
set -uo pipefail
OUT=${OUT:-runs/rollout_first}
BUDGET=${BUDGET:-300}
DIR="$OUT/rollout_first"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
timeout 150 python3 profiling/prebuild_engine_kernels.py qwen3-30b-a3b:2,64,16384 > "$DIR/build.log" 2>&1
echo "prebuild exit $? (${SECONDS}s)"
timeout $(( $(left) - 10 )) python3 profiling/bench_rollout.py --quick --generate-reps 5 --refit-iters 0 \
  --arms nvfp4:compact:graphs,nvfp4:off:graphs --out "$DIR/rollout_h200_first_generates.json" > "$DIR/bench.log" 2>&1
echo "bench exit $?"; tail -3 "$DIR/bench.log"
python3 - "$DIR/rollout_h200_first_generates.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    for i, g in enumerate([r["first_generate"]] + r["later_generates"]):
        print(r["capture"], i, " ".join(f"{k}={v:.4g}" for k, v in g.items() if k != "decode_steps"))
PY
