#!/usr/bin/env bash
# A record: it names memory-kernel variants removed on 2026-12-05 (refit_weights v1, v3-v7, v10, v11; quantize v1,
# v4; guided_fake_quantize v1-v6 as variants), so it runs as written only on commit 32f5e89 or earlier.
# Per-SASS-instruction execution counts (Nsight Compute source page) of the memory kernels at 64 MB:
# where their instructions go. Outputs in $OUT/sass/ (CSV per case), tarred to $OUT/sass.tar.
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_memory_sass_counts.sh
set -uo pipefail
W="$OUT/sass"; mkdir -p "$W"; trap 'tar -cf "$OUT/sass.tar" -C "$W" .' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for c in ${CASES:-quantize:v2 guided-compact:v4 refit:v2}; do
  n=${c//[:+]/_}; skip=1; count=1
  [ "$c" = "refit:v2" ] && { skip=3; count=1; }  # the quantize pass of the second call
  timeout 120 "$NCU" --clock-control none --section SourceCounters --section InstructionStats -k regex:nvfp4_ \
    --launch-skip $skip --launch-count $count -o "$W/$n" -f python3 profiling/ncu_memory_case.py "$c" --mb 64 > "$W/$n.log" 2>&1
  echo "$c profile exit $?"
  timeout 60 "$NCU" --import "$W/$n.ncu-rep" --page source --print-source sass --csv > "$W/$n.csv" 2> "$W/$n.err"
  echo "$c source exit $? ($(wc -l < "$W/$n.csv") lines)"; head -c 600 "$W/$n.csv"; echo
  rm -f "$W/$n.ncu-rep"
done
