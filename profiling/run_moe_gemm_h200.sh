#!/usr/bin/env bash
# One H200 session for the NVFP4 MoE GEMM: build, SASS check, smoke, GPU tests, benchmark, sanitizer.
# Usage (repo root, PYTHONPATH with trace_kernels + nvidia-cutlass + nvtx): bash profiling/run_moe_gemm_h200.sh OUTDIR
# Each step has its own time limit and writes its log to OUTDIR as it goes (at most 8 files come back
# from the device tool). Optional: MOE_NCU=1 profiles one decode and one prefill layer with Nsight
# Compute; MOE_SWEEP=1 runs profiling/sweep_moe_gemm_tiles.py (about 2 min).
set -u
OUT=${1:?output folder}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRACE_KERNELS_CACHE_DIR=${TRACE_KERNELS_CACHE_DIR:-/tmp/tkcache}
PY=${PYTHON:-python3}
T0=$(date +%s)
step() { echo "=== $1 ($(( $(date +%s) - T0 )) s)"; }

{ step env; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
  nvcc --version | tail -2; $PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
  step prebuild; timeout 120 $PY profiling/moe_prebuild.py tiny qwen3-30b-a3b qwen3-235b-a22b; } > "$OUT/build.log" 2>&1

{ step sass
  for c in $(ls -d $TRACE_KERNELS_CACHE_DIR/v1/moe_gemm_*-* 2>/dev/null); do
    s=$(cuobjdump --dump-sass "$c/kernel.cubin")
    echo "$(basename $c): HGMMA=$(grep -c HGMMA <<< "$s") LDL=$(grep -c 'LDL' <<< "$s") STL=$(grep -c 'STL' <<< "$s") BAR=$(grep -c 'BAR.SYNC' <<< "$s")"
  done
  for c in $(ls -d $TRACE_KERNELS_CACHE_DIR/v1/moe_gemm_gate_up_swiglu_nvfp4_e128_h2048_i768_tn*-* 2>/dev/null); do
    echo "##### $(basename $c)"; cuobjdump --dump-sass "$c/kernel.cubin" | grep -E "HGMMA|LDL|STL|LDS|BAR|DEPBAR|LDGSTS|WARPGROUP" | head -400
  done; } >> "$OUT/build.log" 2>&1

{ step smoke-tiny; timeout 60 $PY profiling/moe_gemm_smoke.py --shape tiny --tokens 37
  step smoke-30b; timeout 60 $PY profiling/moe_gemm_smoke.py --shape qwen3-30b-a3b --tokens 300; } > "$OUT/smoke.log" 2>&1

{ step bench; timeout 100 $PY profiling/bench_moe_gemm.py --reps 10 --out "$OUT/moe_gemm_h200.json"; } > "$OUT/bench.log" 2>&1

{ step pytest; timeout 110 $PY -m pytest tests/gpu/test_moe_gemm.py -q -rf -p no:cacheprovider --durations=5; } > "$OUT/pytest.log" 2>&1

{ step memcheck; timeout 45 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 $PY profiling/moe_gemm_smoke.py --shape tiny --tokens 37 2>&1 | tail -40
  echo "memcheck exit ${PIPESTATUS[0]}"
  left=$(( 405 - ($(date +%s) - T0) ))
  if [ $left -gt 20 ]; then step racecheck; timeout $left compute-sanitizer --tool racecheck --error-exitcode 9 $PY profiling/moe_gemm_smoke.py --shape tiny --tokens 37 2>&1 | tail -40; echo "racecheck exit ${PIPESTATUS[0]}"; fi
  step done; } > "$OUT/sanitizer.log" 2>&1
rm -f "$OUT/moe_gemm_h200.json.partial"
if [ "${MOE_NCU:-0}" = 1 ]; then
  { for t in 64 16384; do step "ncu T=$t"
      timeout 120 ncu --clock-control none --kernel-name regex:moe_gemm_ --launch-skip 2 --launch-count 2 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
        $PY profiling/moe_gemm_ncu_case.py --shape qwen3-30b-a3b --tokens $t
    done; } > "$OUT/ncu.log" 2>&1
fi
if [ "${MOE_SWEEP:-0}" = 1 ]; then
  { step sweep; timeout 240 $PY profiling/sweep_moe_gemm_tiles.py --out "$OUT/moe_gemm_tile_sweep_h200.json"; } >> "$OUT/bench.log" 2>&1
fi
grep -E "HGMMA|built" "$OUT/build.log" | head -40; cat "$OUT/smoke.log"; tail -25 "$OUT/bench.log"; tail -15 "$OUT/pytest.log"; grep -E "exit|ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitizer.log"
