#!/usr/bin/env bash
# Issue 3 on the H200, every kernel variant in one run (< 8 minutes): build all variants, SASS
# facts, the bit-exact GPU tests for every variant, compute-sanitizer memcheck + racecheck on a
# small subset, the memory-kernel benchmark (all variants + copy study), then a short table.
# Logs and JSON (memory_kernels_<card>.json, e.g. memory_kernels_h200.json) go to ${OUT:-runs/issue3}. Every step
# has its own time limit, so one slow step cannot eat the others' time.
# Usage (repo root; carry .whl and, built by `python profiling/prebuild_device_caches.py memory`, .tkcache):
#   OUT=$OUT bash profiling/device/run_gpu_checks_issue3.sh
set -uo pipefail
OUT=${OUT:-runs/issue3}
mkdir -p "$OUT"
source profiling/device/gpu_env.sh "$OUT/setup.log"
export TRACE_KERNELS_PTXAS_CHECK=1  # a variant that spills fails its build
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"

timeout 75 python3 -c "
import time; t=time.time()
from trace_kernels import jit
from trace_kernels.testing.kernel_sets import memory_kernel_specs
specs = memory_kernel_specs(); entries = jit.build_all(specs, jobs=16, keep_going=True)
bad = [(s.name, str(e)[-600:]) for s, e in zip(specs, entries) if isinstance(e, Exception)]
for name, error in bad: print('FAILED', name, error)
print(f'built/verified {len(specs) - len(bad)} of {len(specs)} kernels (every variant) in {time.time()-t:.1f}s')" > "$OUT/build.log" 2>&1
echo "build exit: $?" | tee -a "$OUT/build.log"; tail -2 "$OUT/build.log"

# SASS facts per kernel (bf16, D = 2048): 16-byte accesses, no local memory, instruction count
for name in nvfp4_quantize_bf16_v2_d2048 nvfp4_guided_fake_quantize_bf16_v6_compact_d2048 \
            nvfp4_guided_fake_quantize_bf16_v7_full_counters_d2048 nvfp4_refit_weights_bf16_v2 nvfp4_refit_weights_bf16_v9; do
  cubin=$(ls -d "$TRACE_KERNELS_CACHE_DIR"/v1/${name}_sm90a-*/kernel.cubin 2>/dev/null | head -1)
  [ -n "$cubin" ] || { echo "$name: no cubin" | tee -a "$OUT/build.log"; continue; }
  cuobjdump -sass "$cubin" > "$OUT/sass_$name.txt"
  echo "$name: $(grep -cE '^\s+/\*[0-9a-f]{4,}\*/' "$OUT/sass_$name.txt") SASS, $(grep -c 'LDG.E.*128' "$OUT/sass_$name.txt") LDG.128, $(grep -c 'STG.E.*128' "$OUT/sass_$name.txt") STG.128, $(grep -cE 'LDL|STL' "$OUT/sass_$name.txt") LDL/STL, $(grep -c 'MUFU' "$OUT/sass_$name.txt") MUFU" | tee -a "$OUT/build.log"
done

timeout 75 python3 -m pytest tests/gpu/test_quantize_kernels.py -q -rfE --maxfail=25 -p no:cacheprovider \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests exit: $?" | tee -a "$OUT/gpu_tests.log"; tail -25 "$OUT/gpu_tests.log"

# the results file names the card it ran on (h200, h100, ...): the device tool may lend either
GPU_TAG=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h[0-9]+' | head -1 | tr 'A-Z' 'a-z')
RESULTS="$OUT/memory_kernels_${GPU_TAG:-gpu}.json"
timeout 130 python3 profiling/bench_memory_kernels.py --out "$RESULTS" > "$OUT/bench.log" 2>&1
echo "bench exit: $?" | tee -a "$OUT/bench.log"

SAN="compute-sanitizer --error-exitcode 9 --print-limit 200 --report-api-errors no"
SUBSET="not large and (bitexact or nonfinite or sequence or many_rows or grid_edges) and (1-16 or 17-768 or 5-33-96 or 7-64 or 40-8-32 or nonfinite or grid_edges)"
for tool in memcheck racecheck; do
  timeout $([ $tool = memcheck ] && echo 45 || echo 50) $SAN --tool $tool python3 -m pytest tests/gpu/test_quantize_kernels.py -q -p no:cacheprovider -k "$SUBSET" \
    > "$OUT/sanitizer_$tool.log" 2>&1
  echo "$tool exit: $? (124 = step time limit)" | tee -a "$OUT/sanitizer_$tool.log"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$OUT/sanitizer_$tool.log" | tail -3
  grep -m 8 -E "^========= [A-Z]" "$OUT/sanitizer_$tool.log"
done
echo; echo "== benchmark (full table: $OUT/bench.log) =="; tail -8 "$OUT/bench.log"
python3 - "$RESULTS" <<'PY'
import json, sys
reports = []
for path in sys.argv[1:]:
    try:
        reports.append(json.load(open(path)))
    except (OSError, ValueError):
        print(f"(no {path})")
if not reports:
    sys.exit("no benchmark JSON")
report = reports[0]
rows = [r for rep in reports for r in rep["results"] if r["kernel"] != "copy"]
sizes = [64, 256, 1024]
copy = {r["input_mb"]: r["tb_per_s"] for r in report["results"] if r["kernel"] == "copy"}
print("\n% of same-run copy (minimal bytes)      " + "".join(f"{s:>8d}MB" for s in sizes))
print(f"{'copy TB/s':40s}" + "".join(f"{copy.get(s, float('nan')):10.2f}" for s in sizes))
for name in dict.fromkeys(r["kernel"] for r in rows):
    cells = {r["input_mb"]: r for r in rows if r["kernel"] == name}
    line = "".join(f"{100 * cells[s]['fraction_of_copy']:9.1f}%" if s in cells else f"{'-':>10s}" for s in sizes)
    moved = [cells[s] for s in sizes if s in cells and "moved_fraction_of_copy" in cells[s]]
    note = "  moved: " + "/".join(f"{100 * c['moved_fraction_of_copy']:.0f}%" for c in moved) if moved else ""
    print(f"{name:40s}{line}{note}")
PY
