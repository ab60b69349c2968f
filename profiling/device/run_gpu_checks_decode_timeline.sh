#!/usr/bin/env bash
# Where a decode launch's time goes (twenty-fifth session, 2026-12-04), one call under `timeout` (BUDGET s):
# profiling/decode_timeline.py on the default NVFP4 decode kernel at issue 5's four cases (per-CTA timestamps of a
# build with TRACE_KERNELS_CTA_TIMELINE; the normal build has no stamps), then the same for VARIANTS (optional).
# Usage (repo root; carry .whl, .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_decode_timeline.sh
#   -> $OUT/decode_timeline.tar
set -uo pipefail
OUT=${OUT:-runs/decode_timeline}
BUDGET=${BUDGET:-400}
DIR="$OUT/decode_timeline"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"

for variant in default ${VARIANTS:-}; do
  [ "$(left)" -gt 60 ] || { echo "timeline $variant skipped: $(left)s left"; continue; }
  flag=""; [ "$variant" = default ] || flag="--variant $variant"
  # shellcheck disable=SC2086  # flag is empty or two words
  timeout 150 python3 profiling/decode_timeline.py $flag --out "$DIR/timeline_$variant.json" > "$DIR/timeline_$variant.log" 2>&1
  echo "timeline $variant exit $? (${SECONDS}s)"; grep -E " x |registers|Error|error" "$DIR/timeline_$variant.log" | tail -8
done
echo "== done ($(left)s left)"
