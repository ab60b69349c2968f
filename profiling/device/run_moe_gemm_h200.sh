#!/usr/bin/env bash
# One H200 session for the NVFP4 MoE GEMM, every kernel variant (v1 = verified, ws = warp-specialized
# persistent): build, SASS check, smoke, GPU tests, benchmark (CUDA-graph timing), compute-sanitizer
# memcheck + racecheck on a small case, Nsight Compute on one decode and one prefill layer; the summary
# table is printed last. Fits one device call: each step is cut at the time left before DEADLINE
# (default 540 s), in priority order.
# Usage (repo root, PYTHONPATH with trace_kernels + nvidia-cutlass + nvtx): bash profiling/device/run_moe_gemm_h200.sh OUTDIR
# Files in OUTDIR (at most 8 come back from the device tool): build.log smoke.log pytest.log bench.log
# moe_gemm_h200.json sanitizer.log ncu.log.
set -u
OUT=${1:?output folder}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRACE_KERNELS_CACHE_DIR=${TRACE_KERNELS_CACHE_DIR:-/tmp/tkcache}
PY=${PYTHON:-python3}
T0=$(date +%s)
DEADLINE=${MOE_DEADLINE:-540}
step() { echo "=== $1 ($(( $(date +%s) - T0 )) s)"; }
# seconds for a step: its own cap, or what is left before the deadline (minus a reserve for later steps)
budget() { local left=$(( DEADLINE - ($(date +%s) - T0) - ${2:-0} )); [ "$left" -lt "$1" ] && echo $(( left > 5 ? left : 5 )) || echo "$1"; }

{ step env; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
  nvcc --version | tail -2; $PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
  step prebuild; timeout $(budget 150 300) $PY profiling/moe_prebuild.py tiny qwen3-30b-a3b qwen3-235b-a22b
  echo "prebuild exit $?"; } > "$OUT/build.log" 2>&1

# SASS: HGMMA present, no local memory, setmaxnreg in ws kernels; main-loop instructions per k16 step
{ step sass
  for c in $(ls -d $TRACE_KERNELS_CACHE_DIR/v1/moe_gemm_gate_up_swiglu_nvfp4_e128_h2048*-* $TRACE_KERNELS_CACHE_DIR/v1/moe_gemm_down_routed_nvfp4_e128_h2048*ws1*-* 2>/dev/null); do
    cuobjdump --dump-sass "$c/kernel.cubin" > /tmp/k.sass 2>&1
    loop=$($PY - /tmp/k.sass <<'EOF'
import re, sys
ins = []
for line in open(sys.argv[1]):
    m = re.match(r"\s+/\*([0-9a-f]+)\*/\s+(.*?);", line)
    if m:
        ins.append((int(m.group(1), 16), m.group(2).strip()))
hg = [a for a, t in ins if "HGMMA" in t]
best = None  # innermost backward branch around the first HGMMA: the main loop
for a, t in ins:
    m = re.search(r"BRA (0x[0-9a-f]+)", t)
    if hg and m and a > hg[0] and int(m.group(1), 16) < hg[0] and (best is None or a - int(m.group(1), 16) < best[1] - best[0]):
        best = (int(m.group(1), 16), a)
if best:
    body = [t for a, t in ins if best[0] <= a <= best[1]]
    n = sum("HGMMA" in t for t in body)
    ops = {}
    for t in body:
        op = re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0]
        ops[op] = ops.get(op, 0) + 1
    top = " ".join(f"{k}:{v / max(n, 1):.2g}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:10])
    print(f"loop={len(body)} k16={n} per_k16={len(body) / max(n, 1):.1f} [{top}]")
EOF
)
    echo "$(basename $c): HGMMA=$(grep -c HGMMA /tmp/k.sass) LDL=$(grep -c 'LDL' /tmp/k.sass) STL=$(grep -c 'STL' /tmp/k.sass) MEMBAR=$(grep -c MEMBAR /tmp/k.sass) SETMAXREG=$(grep -c SETMAXREG /tmp/k.sass) $loop"
  done; } >> "$OUT/build.log" 2>&1

# A ws kernel that hangs (a pipeline bug) must not eat the session: if its smoke run times out, the
# later steps run v1 only.
VARIANTS=v1,ws
{ step smoke-tiny-v1; timeout $(budget 60 300) $PY profiling/moe_gemm_smoke.py --shape tiny --tokens 37 --variants v1
  step smoke-tiny-ws; timeout $(budget 60 300) $PY profiling/moe_gemm_smoke.py --shape tiny --tokens 37 --variants ws
  echo "smoke ws exit $?"; } > "$OUT/smoke.log" 2>&1
if grep -q "smoke ws exit 124" "$OUT/smoke.log"; then VARIANTS=v1; echo "ws smoke timed out: v1 only" >> "$OUT/smoke.log"; fi
export TRACE_KERNELS_MOE_TEST_VARIANTS=$VARIANTS
{ step smoke-30b-v1; timeout $(budget 60 300) $PY profiling/moe_gemm_smoke.py --shape qwen3-30b-a3b --tokens 300 --variants v1
  if [ $VARIANTS != v1 ]; then step smoke-30b-ws
    timeout $(budget 60 300) $PY profiling/moe_gemm_smoke.py --shape qwen3-30b-a3b --tokens 300 --variants ws
    echo "smoke ws 30b exit $?"; fi; } >> "$OUT/smoke.log" 2>&1
if grep -q "smoke ws 30b exit 124" "$OUT/smoke.log"; then VARIANTS=v1; echo "ws smoke timed out: v1 only" >> "$OUT/smoke.log"; fi
export TRACE_KERNELS_MOE_TEST_VARIANTS=$VARIANTS

{ step pytest; timeout $(budget 150 200) $PY -m pytest tests/gpu/test_moe_gemm.py -q -rf -p no:cacheprovider --durations=8
  echo "pytest exit $?"; } > "$OUT/pytest.log" 2>&1

{ step bench; timeout $(budget 200 90) $PY profiling/bench_moe_gemm.py --reps 10 --variants $VARIANTS \
    --shapes qwen3-30b-a3b,qwen3-235b-a22b --tokens 1,8,64,256,1024,4096,16384 --extra-tokens 64,16384 \
    --out "$OUT/moe_gemm_h200.json"
  echo "bench exit $?"; } > "$OUT/bench.log" 2>&1
if [ ! -s "$OUT/moe_gemm_h200.json" ] && [ -s "$OUT/moe_gemm_h200.json.partial" ]; then
  mv "$OUT/moe_gemm_h200.json.partial" "$OUT/moe_gemm_h200.json"; fi
rm -f "$OUT/moe_gemm_h200.json.partial"

{ step memcheck; timeout $(budget 60 50) compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
    $PY profiling/moe_gemm_smoke.py --shape tiny --tokens 37 --variants $VARIANTS 2>&1 | tail -30
  echo "memcheck exit ${PIPESTATUS[0]}"
  step racecheck; timeout $(budget 60 40) compute-sanitizer --tool racecheck --error-exitcode 9 \
    $PY profiling/moe_gemm_smoke.py --shape tiny --tokens 37 --variants $VARIANTS 2>&1 | tail -30
  echo "racecheck exit ${PIPESTATUS[0]}"; step done; } > "$OUT/sanitizer.log" 2>&1

# Nsight Compute (clocks left alone): the ws decode and prefill layers (gate_up + down), v1 decode
{ for c in "64 ws" "16384 ws" "64 v1"; do set -- $c; [[ ",$VARIANTS," == *",$2,"* ]] || continue; step "ncu T=$1 $2"
    timeout $(budget 45 0) ncu --clock-control none --kernel-name regex:moe_gemm_ --launch-skip 2 --launch-count 2 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
      --section ComputeWorkloadAnalysis --section SchedulerStats --section InstructionStats \
      $PY profiling/moe_gemm_ncu_case.py --shape qwen3-30b-a3b --tokens $1 --variant $2
  done; } > "$OUT/ncu.log" 2>&1

step summary
grep -E "SETMAXREG|built|exit" "$OUT/build.log" | grep -E "tn8_|tn128|built|exit" | head -24
grep -E "OK|FAIL|TN=" "$OUT/smoke.log"; tail -12 "$OUT/pytest.log"
grep -E "exit|ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitizer.log"
grep -E "ncu T=|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Issued Warp Per Scheduler|Warp Cycles Per Issued" "$OUT/ncu.log" | head -40
tail -14 "$OUT/bench.log"
