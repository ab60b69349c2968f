#!/usr/bin/env bash
# Where the speculative refits stand against the quantize kernel: one round of bench_memory_kernels.py on quantize v2
# and refit v9 in the same run (64 MB - 1 GB), then Nsight Compute (full sections) on refit v9's phase 0 and quantize v2
# at 256 MB, and on refit_weights_packed_'s passes over one Qwen3-30B-A3B gate_up: v2's phase 1 (steady: every guess
# holds) and v1's amax and pack passes.
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_refit_profile.sh
#   -> $OUT/refit_profile.tar
set -uo pipefail
OUT=${OUT:-runs/refit_profile}
BUDGET=${BUDGET:-400}
DIR="$OUT/refit_profile"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
timeout 100 python3 profiling/prebuild_memory_kernels.py --jobs 16 nvfp4_refit nvfp4_quantize_bf16_v2 \
  > "$DIR/build_memory.log" 2>&1
echo "memory build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_memory.log"
timeout 80 python3 profiling/bench_memory_kernels.py --select quantize:v2,refit_weights:v9 --sizes-mb 64,256,1024 \
  --copy-study-mb "" --no-host-overhead --out "$DIR/memory_quantize_refit.json" > "$DIR/bench.log" 2>&1
echo "bench exit $?"; grep -E "^copy |^quantize|^refit" "$DIR/bench.log"
NCU_BIN=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
# case, MB, kernels to skip (the warm-up call's), kernels to profile
for spec in "refit:v9 256 3 1" "quantize:v2 256 1 1" "refit_packed:v2 0 3 1" "refit_packed:v1 0 2 2"; do
  set -- $spec
  [ "$(left)" -gt 50 ] || break
  name="ncu_${1//[:+]/_}_$2"
  timeout 60 "$NCU_BIN" --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section LaunchStats --section InstructionStats \
    --section MemoryWorkloadAnalysis --section SchedulerStats -k regex:'nvfp4_' --launch-skip "$3" --launch-count "$4" \
    python3 profiling/ncu_memory_case.py "$1" --mb "$(( $2 > 0 ? $2 : 64 ))" > "$DIR/$name.txt" 2>&1
  echo "ncu $spec exit $?"
  grep -E "^  nvfp4|Duration|DRAM Throughput|Issue Slots Busy|Registers Per|Achieved Occupancy" "$DIR/$name.txt"
done
echo "== done ($(left)s left)"
