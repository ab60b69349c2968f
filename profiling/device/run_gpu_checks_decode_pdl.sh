#!/usr/bin/env bash
# The decode kernels' prologue on the H200 (twenty-fourth session, 2026-12-04), one call, every step under `timeout`
# (BUDGET s): the mma2-family kernels (mma2, mma3, mma4, mma4l) now issue their first tiles' copies before they read
# q, and every decode kernel waits for the previous kernel in split_range, so it can be launched as a programmatic
# dependent (attention.DECODE_PDL).
#   1. build: what is not in the carried cache (the KV test kernels, the base tree's mma4l; BASE: a copy of the
#      previous commit's python/, cuda/, codegen/ and bench scripts), in parallel
#   2. the KV GPU tests (decode against the reference at every split count, CUDA graphs; append; gather)
#   3. decode A/B, ROUNDS (default 2) rounds of the four decode cases: mma4l on the base tree, on this tree as a
#      programmatic dependent launch and as an ordinary one (ARMS, default "base pdl plain")
#   4. compute-sanitizer memcheck and racecheck on mma4l's split and bytes-past-the-end tests
# Usage (repo root; carry .whl, .tkcache, .ab_base): OUT=$OUT bash profiling/device/run_gpu_checks_decode_pdl.sh
#   -> $OUT/decode_pdl.tar
set -uo pipefail
OUT=${OUT:-runs/decode_pdl}
BUDGET=${BUDGET:-570}
BASE=${BASE:-.ab_base}
DIR="$OUT/decode_pdl"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"

PYTHONPATH=/tmp/site:$PWD/$BASE/python timeout 150 python3 "$BASE/profiling/bench_attention.py" --build-only 4 \
  --nvfp4-variants mma4l --build-named-only --bf16-variants "" > "$DIR/build_base.log" 2>&1 &
TRACE_KERNELS_PTXAS_CHECK=1 timeout 150 python3 -c "
from trace_kernels import jit, kv_testing
specs = kv_testing.kernel_specs()
bad = [s.name for s, e in zip(specs, jit.build_all(specs, jobs=12, keep_going=True)) if isinstance(e, Exception)]
print('kv kernels', len(specs), 'failed', bad)" > "$DIR/build_kv.log" 2>&1
echo "kv build exit $? (${SECONDS}s)"; tail -1 "$DIR/build_kv.log"
wait
echo "base build (${SECONDS}s): $(tail -1 "$DIR/build_base.log")"

gpu_tests 200 "$DIR/kv_tests.log" -m gpu tests/gpu/test_kv_kernels.py

for round in $(seq 1 "${ROUNDS:-2}"); do
  for arm in ${ARMS:-base pdl plain}; do
    [ "$(left)" -gt 110 ] || { echo "decode $arm $round skipped: $(left)s left"; continue; }
    if [ "$arm" = base ]; then py=$PWD/$BASE/python; script=$BASE/profiling/bench_attention.py; flag=""
    else py=$PWD/python; script=profiling/bench_attention.py; flag="--decode-pdl $([ "$arm" = pdl ] && echo 1 || echo 0)"; fi
    PYTHONPATH=/tmp/site:$py:$PWD/rl timeout 60 python3 "$script" --decode-only --nvfp4-variants mma4l \
      --bf16-variants "" $flag --out "$DIR/attention_${arm}$round.json" > "$DIR/decode_${arm}$round.log" 2>&1
    echo "decode $arm $round exit $? (${SECONDS}s)"
    grep -E "^ +[0-9]+ +[0-9]+ \| +nvfp4" "$DIR/decode_${arm}$round.log" | awk '{print $1, $2, $5, $9}' | tr '\n' ';'
    echo
  done
done

decode_sanitizers "$DIR"
echo "== done ($(left)s left)"
