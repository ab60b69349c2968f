#!/usr/bin/env bash
# A record: it names memory-kernel variants removed on 2026-12-05 (refit_weights v1, v3-v7, v10, v11; quantize v1,
# v4; guided_fake_quantize v1-v6 as variants), so it runs as written only on commit 32f5e89 or earlier.
# refit v10 (v9's speculative refit in one persistent launch) and the speculative phase 0's block loop (the block
# amaxes kept, the fast / exact path picked once per tile) on the H200 in one call: the refit GPU tests of every
# variant, compute-sanitizer memcheck and racecheck on v9's and v10's small tests, then ROUNDS (default 2) rounds of
# bench_memory_kernels.py on refit v2, v9 and v10 (fresh, steady and mixed weights), then Nsight Compute (SOL, pipes,
# stalls, instruction mix, memory, occupancy) on v9's three kernels, v10's one and quantize v2 at 64 MB, the refits on
# steady weights (ncu_memory_case.py's second call: the same weights again; NCU=0 skips).
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_refit_v10.sh -> $OUT/refit_v10.tar
set -uo pipefail
OUT=${OUT:-runs/refit_v10}
BUDGET=${BUDGET:-570}
DIR="$OUT/refit_v10"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
timeout 100 python3 profiling/prebuild_memory_kernels.py --jobs 16 > "$DIR/build_memory.log" 2>&1
echo "memory build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_memory.log"
gpu_tests 170 "$DIR/refit_gpu_tests.log" -m gpu tests/gpu/test_quantize_kernels.py \
  -k "refit and (not guided or (nonfinite and v10))"  # every refit variant; the NaN test with v10 (x each guided one)
V10_TESTS=(tests/gpu/test_quantize_kernels.py -k "refit and (v9 or v10) and not large and not 4096 and not guided")
for tool in memcheck racecheck; do
  sanitize "$tool" 80 "$DIR/${tool}_refit_v9_v10.log" python3 -m pytest -q -p no:cacheprovider -m gpu "${V10_TESTS[@]}"
done
for round in $(seq 1 "${ROUNDS:-2}"); do
  [ "$(left)" -gt 120 ] || break
  timeout 90 python3 profiling/bench_memory_kernels.py --select refit_weights:v2,refit_weights:v9,refit_weights:v10 \
    --sizes-mb 16,64,256,1024 --copy-study-mb "" --no-host-overhead --out "$DIR/memory_refit_v10_$round.json" \
    > "$DIR/bench_$round.log" 2>&1
  echo "bench $round exit $?"; grep -E "^copy|^refit" "$DIR/bench_$round.log" | grep -v "\[v2\]"
done
if [ "${NCU:-1}" = 1 ] && [ "$(left)" -gt 60 ]; then
  NCU_BIN=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  for case in refit:v9 refit:v10 quantize:v2; do  # the profiled call: the second (refit: every guess holds)
    launches=1; [ "$case" = refit:v9 ] && launches=3
    timeout 60 "$NCU_BIN" --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \
      --section WarpStateStats --section Occupancy --section LaunchStats --section InstructionStats \
      --section MemoryWorkloadAnalysis --section SchedulerStats -k regex:'nvfp4_' --launch-skip $launches \
      --launch-count $launches python3 profiling/ncu_memory_case.py "$case" --mb 64 > "$DIR/ncu_${case//[:+]/_}.txt" 2>&1
    echo "ncu $case exit $?"
    grep -E "^  nvfp4|Duration|DRAM Throughput|Issue Slots Busy|Registers Per" "$DIR/ncu_${case//[:+]/_}.txt" | head -16
  done
fi
echo "== done ($(left)s left)"
