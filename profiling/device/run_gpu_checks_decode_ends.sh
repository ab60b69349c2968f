#!/usr/bin/env bash
# A decode CTA's start and end (twenty-fifth session, 2026-12-04), one call, every step under `timeout` (BUDGET s):
#   1. build: the KV test kernels and the RL GPU tests' engine kernels not in the carried cache
#   2. decode_ab.py (AB=0 skips it): the default NVFP4 decode kernel (mma4l) built from BASE's headers and from this
#      tree's, outputs compared bit for bit on random cases (split counts 1 to the planner's), then ROUNDS rounds of the
#      four decode cases at the planner's split count and at SPLITS; EXTRA_ARMS (NAME=DIR[:MACRO,...]) after those
#   3. decode_timeline.py on this tree (per-CTA stamps, the combine's too; TIMELINE=0 skips it); one round of each of
#      VARIANTS (other mma4l configurations, this tree) at the planner's split count
#   4. (TESTS=0 skips 4 and 5) the KV GPU tests; compute-sanitizer memcheck and racecheck (decode_sanitizers)
#   5. the RL layer's GPU tests (RL=0 skips them)
# The twenty-fifth session ran it three times on three trees (docs/kv_cache.md, "A decode CTA's start and end"). The
# thirty-first (2026-12-05, an H100) ran it at 547b8ce with the arms of the uneven split plan (NAME=DIR@RATE), the
# in-kernel split merge (+fused) and the lane-copy macro, and the checks (results/attention_decode_ab_*_h100.json);
# none was faster there and all three went, with those arm forms (docs/kv_cache.md says which verdicts an H100 decides).
# Next: the checks of the tree after that removal and after the tile body took two MMA column blocks (mma4l_c16; the
# thirty-second session), with the A/B of 3020219's headers (.ab_base): the same FP32 operations in the same order at
# one column block, scheduled differently by nvcc, so decode_ab.py's bitwise comparison and timing are the check:
# OUT=$OUT ROUNDS=1 SPLITS="" VARIANTS="" TIMELINE=0 bash ...
# Usage (repo root; carry .whl, .tkcache, .ab_base): OUT=$OUT bash profiling/device/run_gpu_checks_decode_ends.sh
#   .tkcache: python profiling/prebuild_device_caches.py kv engine (2 min here); .ab_base: mkdir .ab_base &&
#   git archive 3020219 cuda | tar -x -C .ab_base
#   -> $OUT/decode_ends.tar
set -uo pipefail
OUT=${OUT:-runs/decode_ends}
BUDGET=${BUDGET:-570}
BASE=${BASE:-.ab_base}
DIR="$OUT/decode_ends"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"

TRACE_KERNELS_PTXAS_CHECK=1 timeout 150 python3 -c "
from trace_kernels import jit, kv_testing
specs = kv_testing.kernel_specs()
bad = [s.name for s, e in zip(specs, jit.build_all(specs, jobs=14, keep_going=True)) if isinstance(e, Exception)]
print('kv kernels', len(specs), 'failed', bad)" > "$DIR/build_kv.log" 2>&1
echo "kv build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_kv.log"
if [ "${RL:-1}" = 1 ]; then
  prebuild_engine_test_models 90 "$DIR/build_engine.log"; echo "engine build exit $? (${SECONDS}s)"
  tail -1 "$DIR/build_engine.log"
fi

if [ "${AB:-1}" = 1 ]; then
  arms=(--arm "base=$BASE/cuda/include" --arm new=cuda/include)
  for arm in ${EXTRA_ARMS:-}; do arms+=(--arm "$arm"); done
  decode_ab decode_ab 200 "${arms[@]}" --split-counts "${SPLITS-16,32,64}"
fi

if [ "${TIMELINE:-1}" = 1 ]; then
  timeout 100 python3 profiling/decode_timeline.py --out "$DIR/timeline.json" > "$DIR/timeline.log" 2>&1
  echo "timeline exit $? (${SECONDS}s)"; grep -E " x |Error|error" "$DIR/timeline.log" | cut -c1-400
fi

for variant in ${VARIANTS-mma4l_w4s2 mma4l_w1s2}; do
  [ "$(left)" -gt 330 ] || { echo "variant $variant skipped: $(left)s left"; continue; }
  timeout 90 python3 profiling/decode_ab.py --variant "$variant" --arm new=cuda/include --rounds 1 \
    --out "$DIR/decode_$variant.json" > "$DIR/decode_$variant.log" 2>&1
  echo "variant $variant exit $? (${SECONDS}s)"; grep -E "registers" "$DIR/decode_$variant.log"
  grep -E "^round" "$DIR/decode_$variant.log" | awk '{print $4 "x" $6, $7, $11}' | tr '\n' ';'; echo
done

if [ "${TESTS:-1}" = 1 ]; then
  # 330 tests took 92-105 s; 215 since the losing decode variants went (2026-12-05). At most 240 s, and 50 s stay for
  # the sanitizers when the A/B ran first in the same call
  limit=$(( $(left) - 50 )); [ "$limit" -gt 240 ] && limit=240; [ "$limit" -lt 60 ] && limit=60
  gpu_tests "$limit" "$DIR/kv_tests.log" -m gpu tests/gpu/test_kv_kernels.py
  decode_sanitizers "$DIR"
  if [ "${RL:-1}" = 1 ] && [ "$(left)" -gt 80 ]; then
    gpu_tests $(( $(left) - 5 )) "$DIR/rl_gpu_tests.log" -m gpu tests/rl
  fi
fi
echo "== done ($(left)s left)"
