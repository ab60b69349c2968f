#!/usr/bin/env bash
# Issue 6 (rollout engine on the kernels) on the H200 in one go, under 10 minutes: install the
# carried wheels, prebuild the kernels the engine launches (tiny-kernels, small and bench shapes)
# in parallel, the engine's GPU tests, bench_rollout --quick, then compute-sanitizer memcheck on a
# small engine test with the time that is left. Logs + JSON go to ${OUT:-runs/rollout}.
# Usage (repo root; the device tool sets OUT):
#   bash profiling/device/run_gpu_checks_rollout.sh
set -uo pipefail
OUT=${OUT:-runs/rollout}
BUDGET=${BUDGET:-570}  # seconds for the whole script
mkdir -p "$OUT"
source profiling/device/gpu_env.sh "$OUT/pip.log"  # wheels, PYTHONPATH, JIT cache, left()
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())" \
  >> "$OUT/gpu.txt" 2>&1
python3 -c "import safetensors" 2> /dev/null || echo "safetensors missing: the guidance-store GPU test will skip" | tee -a "$OUT/gpu.txt"

echo "== prebuild ($(left)s left)"
# (shape:token counts the tests and the quick bench route per MoE call): tiny-kernels, small, bench
timeout 150 python3 profiling/prebuild_engine_kernels.py "E=8,H=64,I=64,k=2,hq=4,hkv=2,hd=64:1,8,40" \
  "E=32,H=512,I=256,k=4,hq=8,hkv=2,hd=64:1,8,40" qwen3-30b-a3b:2,64,16384 > "$OUT/build.log" 2>&1
echo "prebuild exit $?"; grep -E "FAILED|built" "$OUT/build.log" | tail -8

echo "== GPU tests ($(left)s left)"
timeout 200 python3 -m pytest tests/rl/test_engine_gpu.py tests/rl/test_engine.py -m gpu -q -rfE -p no:cacheprovider \
  > "$OUT/gpu_tests.log" 2>&1
echo "pytest exit $?"; tail -25 "$OUT/gpu_tests.log"

echo "== bench_rollout --quick ($(left)s left)"
timeout $(( $(left) > 60 ? $(left) - 45 : 15 )) python3 profiling/bench_rollout.py --quick \
  --out "$OUT/rollout_h200_quick.json" > "$OUT/bench.log" 2>&1
echo "bench exit $?"; tail -14 "$OUT/bench.log"

t=$(left)
if [ "$t" -lt 25 ]; then
  echo "memcheck skipped: ${t}s left" | tee "$OUT/sanitizer_memcheck.log"
else
  echo "== memcheck (${t}s)"
  timeout "$t" compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 --print-limit 20 \
    python3 -m pytest tests/rl/test_engine_gpu.py -q -p no:cacheprovider \
    -k "tiny-kernels and graph_replay_equals_eager and nvfp4" \
    > "$OUT/sanitizer_memcheck.log" 2>&1
  echo "memcheck exit: $? (limit ${t}s)" | tee -a "$OUT/sanitizer_memcheck.log"
  grep -E "ERROR SUMMARY|passed|failed" "$OUT/sanitizer_memcheck.log" | tail -3
fi
echo "total ${SECONDS}s"
