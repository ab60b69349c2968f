#!/usr/bin/env bash
# Guidance capture with rows regrouped on the device and finalize into a reused sorted buffer, on
# the H200 (< 8 min): the engine's GPU tests (guidance bit for bit against the reference recorder,
# graphs, no host sync), memcheck on the graphed NVFP4 capture test, the paired capture A/B of
# bench_rollout (decode steps at batch 512 x 1K and 128 x 32K; whole generate calls, batch 512, 1K
# prompts, 256 new tokens, ROUNDS rounds, per-step times), then long outputs (32K) with 4K and 8K
# prompts under the current attention default. Outputs in $OUT/fin/, packed into $OUT/fin.tar.
# Knobs: TESTS=0 skips the tests and memcheck; CAPTURE_AB (decode A/B points, "" for none); ARMS
# (--ab-generate-arms); ROUNDS; LONG_PROMPTS ("" for none).
# Usage (repo root; carry .whl and .tkcache): bash profiling/device/run_gpu_checks_capture_finalize.sh
set -uo pipefail
OUT=${OUT:-runs/capture_finalize}
BUDGET=${BUDGET:-560}
W="$OUT/fin"
mkdir -p "$W"
trap 'tar -cf "$OUT/fin.tar" -C "$W" . && rm -rf "$W"' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > "$W/gpu.txt" 2>&1

if [ "${TESTS:-1}" = 1 ]; then
echo "== engine GPU tests ($(left)s left)"
timeout 120 python3 -m pytest tests/rl/test_engine_gpu.py tests/rl/test_guidance_capture.py tests/rl/test_engine_kernels.py \
  -q -rfE -p no:cacheprovider > "$W/engine_tests.log" 2>&1
echo "engine tests exit $?"; tail -2 "$W/engine_tests.log"

SAN="compute-sanitizer --report-api-errors no --error-exitcode 9 --print-limit 100"
echo "== memcheck, graphed NVFP4 engine with capture ($(left)s left)"
timeout 90 $SAN --tool memcheck python3 -m pytest tests/rl/test_engine_gpu.py -q -p no:cacheprovider \
  -k "tiny-kernels and graph_replay_equals_eager and nvfp4 and compact" > "$W/engine_memcheck.log" 2>&1
echo "memcheck exit $?"; grep -E "ERROR SUMMARY|passed|failed" "$W/engine_memcheck.log" | tail -3
fi

# PIN=1: run the benchmarks on the CPU cores local to the GPU (sysfs local_cpulist); a clock and
# power log (nvidia-smi, every 200 ms) runs alongside either way
PINNED=""
if [ "${PIN:-0}" = 1 ]; then
  bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1 | tr 'A-F' 'a-f' | sed 's/^0000//')
  cpus=$(cat "/sys/bus/pci/devices/$bus/local_cpulist" 2>/dev/null)
  [ -n "$cpus" ] && PINNED="taskset -c $cpus"
  echo "GPU $bus, local CPUs ${cpus:-unknown}"
fi
nvidia-smi topo -m > "$W/topo.txt" 2>&1; lscpu > "$W/lscpu.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 200 > "$W/smi_log.csv" 2>&1 &
SMI=$!

echo "== capture A/B ($(left)s left)"
timeout 300 $PINNED python3 profiling/bench_rollout.py --prompt-lens "" --capture-ab "${CAPTURE_AB-512:1024,128:32768}" \
  --capture-ab-generate 512:1024:256 --ab-generate-rounds "${ROUNDS:-6}" --ab-generate-arms "${ARMS:-off,compact}" \
  --out "$W/capture_ab_h200.json" \
  > "$W/capture_ab.log" 2>&1
echo "capture A/B exit $?"; grep -E "^capture" "$W/capture_ab.log"
kill $SMI 2>/dev/null

for prompt in ${LONG_PROMPTS-4096 8192}; do
  t=$(( $(left) - 5 ))
  [ "$t" -lt 30 ] && { echo "no time left for prompt $prompt"; continue; }
  echo "== long outputs, prompt $prompt ($(left)s left)"
  timeout "$t" python3 profiling/bench_rollout.py --prompt-lens "" --long-outputs 32768 --long-prompt "$prompt" \
    --long-steps 32 --long-arms bf16:off,nvfp4:off,nvfp4:compact --max-batch 1024 --mem-fraction 0.8 \
    --out "$W/rollout_h200_long_p$prompt.json" > "$W/bench_rollout_long_p$prompt.log" 2>&1
  echo "long exit $?"; grep -E "^long|x |%" "$W/bench_rollout_long_p$prompt.log" | tail -6
done
echo "== done ($(left)s left)"
