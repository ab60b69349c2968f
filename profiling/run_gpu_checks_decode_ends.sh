#!/usr/bin/env bash
# A decode CTA's start and end (twenty-fifth session, 2026-12-04), one call, every step under `timeout` (BUDGET s):
#   1. build: the KV test kernels and the RL GPU tests' engine kernels not in the carried cache
#   2. decode_ab.py (AB=0 skips it): the default NVFP4 decode kernel (mma4l) built from BASE's headers (the previous
#      commit) and from this tree's, outputs compared bit for bit on random cases (split counts 1 to the planner's),
#      then ROUNDS rounds of the four decode cases at the planner's split count and at SPLITS; EXTRA_ARMS after those.
#      FUSED_ARMS: a second decode_ab.py run, new against those arms (a trap there cannot lose the first run's JSON)
#   3. decode_timeline.py on this tree (per-CTA stamps, the combine's too) at each RATE[+fused] of TIMELINES
#      (attention.FIRST_CTA_RATE; +fused: the split merge inside the decode kernel); one round of each of VARIANTS
#      (other mma4l configurations, this tree) at the planner's split count
#   4. (TESTS=0 skips 4 and 5) the KV GPU tests; compute-sanitizer memcheck and racecheck on mma4l's split, graph,
#      past-the-end and fused-merge tests
#   5. the RL layer's GPU tests (RL=0 skips them)
# The session ran it three times on three trees (docs/kv_cache.md, "A decode CTA's start and end"): call 2 (steps 1-4,
# then named run_gpu_checks_decode_merge.sh) with the merge's weights computed once per head, call 3 with the first
# copies' page-table reads issued beside the length's and a swizzled merge buffer (both measured, then reverted), call 4
# (SPLITS="" VARIANTS="") with four outputs per thread in the merge, call 5 (also EXTRA_ARMS="w4=.ab_w4/cuda/include", a
# copy of call 4's headers) with eight.
# Next (written in the twenty-sixth to twenty-eighth sessions, no device lent), with .ab_base the headers of 3020219
# (before the uneven plan: base vs new is then the even plan's cost of decode_cta and of the fused merge's check):
#   call A, the uneven split plan, the split merge inside the kernel and mma4's lane copy constants (docs/kv_cache.md)
#   against the even plan, the combine kernel and the per-tile constants:
#     TESTS=0 SPLITS="" VARIANTS="" EXTRA_ARMS="u11=cuda/include@1.1 u12=cuda/include@1.2
#     lane=cuda/include:TRACE_KERNELS_DECODE_LANE_COPY" FUSED_ARMS="fused=cuda/include+fused
#     u12f=cuda/include@1.2+fused" TIMELINES="1.0 1.2 1.0+fused"
#   call B, the checks: AB=0 TIMELINES="" VARIANTS="" (the KV GPU tests, 215 since the losing decode variants went on
#     2026-12-05: the GQA 5 / 12 decode cases of the twenty-seventh session and the fused merge's of the twenty-eighth,
#     not yet run on a GPU; sanitizers; RL tests)
#   or both in one call (thirtieth session, 2026-12-05, when starts were scarce): call A's settings with BUDGET=565
#     RL=0 TIMELINES="" and the tests left on (the KV tests get what the A/B leaves, less 50 s for the sanitizers)
# Usage (repo root; carry .whl, .tkcache, .ab_base): OUT=$OUT bash profiling/run_gpu_checks_decode_ends.sh
#   .tkcache: python profiling/prebuild_device_caches.py kv engine (2 min here); .ab_base: mkdir .ab_base &&
#   git archive 3020219 cuda | tar -x -C .ab_base
#   -> $OUT/decode_ends.tar
set -uo pipefail
OUT=${OUT:-runs/decode_ends}
BUDGET=${BUDGET:-570}
BASE=${BASE:-.ab_base}
DIR="$OUT/decode_ends"
mkdir -p "$DIR"
source profiling/gpu_env.sh "$DIR/setup.log"
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

# decode_ab NAME LIMIT ARM...: decode_ab.py over the arms, DIR/NAME.{json,log}, its checks and times printed
decode_ab() {
  local name=$1 limit=$2 arm arms=(); shift 2
  for arm in "$@"; do arms+=(--arm "$arm"); done
  timeout "$limit" python3 profiling/decode_ab.py "${arms[@]}" --rounds "${ROUNDS:-2}" --split-counts "${SPLITS-16,32,64}" \
    --out "$DIR/$name.json" > "$DIR/$name.log" 2>&1
  echo "$name exit $? (${SECONDS}s)"; grep -E "registers|bitwise|reference|differ|Error" "$DIR/$name.log"
  grep -E "^round" "$DIR/$name.log" | awk '{print $2, $3, $4 "x" $6, $7, $11, $13}' | tr '\n' ';'; echo
}
if [ "${AB:-1}" = 1 ]; then
  decode_ab decode_ab 200 "base=$BASE/cuda/include" new=cuda/include ${EXTRA_ARMS:-}
  [ -n "${FUSED_ARMS:-}" ] && decode_ab decode_ab_fused 150 new=cuda/include $FUSED_ARMS
fi

for item in ${TIMELINES-1.0}; do  # RATE or RATE+fused
  rate=${item%+fused}; fused=0; [ "$item" != "$rate" ] && fused=1
  timeout 100 python3 profiling/decode_timeline.py --first-cta-rate "$rate" --fused-combine "$fused" \
    --out "$DIR/timeline_$item.json" > "$DIR/timeline_$item.log" 2>&1
  echo "timeline ($item) exit $? (${SECONDS}s)"; grep -E " x |Error|error" "$DIR/timeline_$item.log" | cut -c1-400
done

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
