#!/usr/bin/env bash
# Issue 4, one H200 call (eleventh session of 2026-12-02): v1's overlapped main loop (a chunk's wgmmas in
# flight while the next chunk is dequantized into a second A register buffer) as ptxas now compiles it:
# whole ring turns in the loop, the wgmmas drained at each turn's end, the K remainder after the loop.
# Before, every v1 overlap kernel carried ptxas's C7513 note (a wait after every wgmma), so the earlier
# "overlap is no faster" measurements timed serialized kernels.
#   (1) prebuild (a no-op for what the carried .tkcache holds)
#   (2) the MoE GPU tests: every table and extra tile bitwise against the others and batch-invariant
#       (auto_ov's overlapped gate_up tiles are extras now), graph replay / PDL / status with auto_ov
#   (3) the layer, auto against auto_ov (auto's v1 tiles overlapped), same run, both presets, two rounds
#   (4) memcheck / racecheck on the tiny layer (every tiling) with the time left
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_moe_overlap.sh
set -uo pipefail
OUT=${OUT:-runs/moe_overlap}
BUDGET=${BUDGET:-570}
DIR="$OUT/moe_ov"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
timeout 150 python3 profiling/moe_prebuild.py --tables auto,auto_ov --no-extras qwen3-235b-a22b qwen3-30b-a3b \
  > "$DIR/build_bench.log" 2>&1
echo "bench build exit $? (${SECONDS}s)"; tail -2 "$DIR/build_bench.log"
timeout 200 python3 profiling/moe_prebuild.py --jobs 16 tiny qwen3-30b-a3b > "$DIR/build_tests.log" 2>&1
echo "test build exit $? (${SECONDS}s)"; tail -2 "$DIR/build_tests.log"
gpu_tests 150 "$DIR/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
for round in 1 2; do
  [ "$(left)" -lt 90 ] && break
  tokens=1,8,32,64,128,256,1024,4096,16384
  [ "$round" = 2 ] && tokens=8,32,64,128,256,1024
  timeout $(( $(left) - 60 )) python3 profiling/bench_moe_gemm.py --variants auto,auto_ov --tokens "$tokens" \
    --reps 10 --out "$DIR/moe_gemm_h200_overlap_round$round.json" > "$DIR/bench_round$round.log" 2>&1
  echo "bench round $round exit $? (${SECONDS}s)"
  grep -E "^qwen3\S+ +[0-9]" "$DIR/bench_round$round.log" | head -40
done
limit=$(( ($(left) - 5) / 2 )); [ "$limit" -gt 60 ] && limit=60
[ "$limit" -gt 15 ] && moe_sanitizers "$DIR" "$limit"
