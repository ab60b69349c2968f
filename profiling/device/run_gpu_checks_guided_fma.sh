#!/usr/bin/env bash
# A record: it names memory-kernel variants removed on 2026-12-05 (refit_weights v1, v3-v7, v10, v11; quantize v1,
# v4; guided_fake_quantize v1-v6 as variants), so it runs as written only on commit 32f5e89 or earlier.
# Tenth session of 2026-12-02 on the H200, two calls (PART=1, then PART=2 on the still-warm machine, which keeps
# the JIT cache .tkcache), every step under `timeout` (BUDGET s):
#   1. build: every memory kernel of the tests and benchmarks (spills fail the build: TRACE_KERNELS_PTXAS_CHECK=1),
#      the decode kernels of the split study, and the base tree's guided kernels (BASE: a copy of the previous
#      commit's python/, cuda/, codegen/ and bench script), in parallel
#   2. the guided GPU tests of v3, v4, v6 and v7 (bit-exact outputs and counters against the reference)
#   3. bench_memory_kernels.py, guided v7 in every mode, base tree and this tree in turn, twice, 64 / 256 MB;
#      then v7's full guidance with counters at two other occupancies
#   4. decode: mma4l at the planned split count and at fixed ones (bench_attention.py --splits), and Nsight Compute's
#      durations of the decode kernel and of the split combine at (B, L) = (8, 32K)
#   5. compute-sanitizer memcheck and racecheck on v7's capped-grid guided tests (every mode)
#   (part 1: steps 1-3; part 2: steps 4-5)
# Usage (repo root; carry .whl, .ab_base): OUT=$OUT PART=1 BASE=.ab_base bash profiling/device/run_gpu_checks_guided_fma.sh
#   -> $OUT/guided_fma<PART>.tar
set -uo pipefail
OUT=${OUT:-runs/guided_fma}
BUDGET=${BUDGET:-560}
BASE=${BASE:-.ab_base}
PART=${PART:-1}
DIR="$OUT/guided_fma$PART"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/setup.log"

if [ "$PART" = 1 ]; then
TRACE_KERNELS_PTXAS_CHECK=1 timeout 200 python3 profiling/prebuild_memory_kernels.py --jobs 10 \
  nvfp4_guided_fake_quantize_bf16_v7 nvfp4_guided_fake_quantize_bf16_v4_d2048 > "$DIR/build_memory.log" 2>&1 &
PYTHONPATH=/tmp/site:$PWD/$BASE/python timeout 200 python3 -c "
from trace_kernels import jit
from trace_kernels.codegen.ops import guided_fake_quantize as g
specs = list({s.name: s for s in (g.spec('bf16', 2048, 'v7', m) for m in g.MODES)}.values())
for s, e in zip(specs, jit.build_all(specs, jobs=4, keep_going=True)):
    print(s.name, 'FAILED' if isinstance(e, Exception) else 'ok')
" > "$DIR/build_base.log" 2>&1 &
timeout 200 python3 profiling/bench_attention.py --build-only 2 --nvfp4-variants mma4l --build-named-only \
  --bf16-variants "" > "$DIR/build_kv.log" 2>&1
echo "kv build exit $? (${SECONDS}s)"; grep -E "FAILED|kernels built" "$DIR/build_kv.log" | tail -2
wait
echo "memory build (${SECONDS}s):"; grep -E "FAILED|_d2048|built" "$DIR/build_memory.log" | grep -v "_mb12_" | cut -c1-150 | tail -8
cat "$DIR/build_base.log"

gpu_tests 140 "$DIR/guided_tests.log" tests/gpu/test_quantize_kernels.py --maxfail=20 -k "guided and (v3 or v4 or v6 or v7)"

for round in 1 2; do
  for tree in base new; do
    if [ "$tree" = new ]; then py=$PWD/python; script=profiling/bench_memory_kernels.py
    else py=$PWD/$BASE/python; script=$BASE/profiling/bench_memory_kernels.py; fi
    PYTHONPATH=/tmp/site:$py:$PWD/profiling timeout 60 python3 "$script" --select guided_fake_quantize:v7 \
      --sizes-mb 64,256 --copy-study-mb "" --no-host-overhead --out "$DIR/guided_${tree}$round.json" \
      > "$DIR/bench_${tree}$round.log" 2>&1
    echo "bench $tree $round exit $? (${SECONDS}s)"
    grep -E "^guided|^copy" "$DIR/bench_${tree}$round.log" | sed "s/guided_fake_quantize //" | tr -s " " | cut -c1-70
  done
done
for geometry in full_counters=256x2 full_counters=128x3; do
  timeout 45 python3 profiling/bench_memory_kernels.py --select guided_fake_quantize:v7 --sizes-mb 64,256 \
    --copy-study-mb "" --no-host-overhead --guided-v7-geometry "$geometry" --out "$DIR/guided_${geometry//[=x]/_}.json" \
    > "$DIR/bench_${geometry//[=x]/_}.log" 2>&1
  echo "bench [$geometry] exit $? (${SECONDS}s)"
  grep -E "^guided.*full \[|^copy" "$DIR/bench_${geometry//[=x]/_}.log" | sed "s/guided_fake_quantize //" | tr -s " " | cut -c1-70
done
exit 0
fi

timeout 90 python3 profiling/bench_attention.py --decode-only --nvfp4-variants mma4l --bf16-variants "" \
  --splits 8,12,16,24,32,48,64 --out "$DIR/attention_splits.json" > "$DIR/splits.log" 2>&1
echo "splits exit $? (${SECONDS}s)"
grep -E "^ +[0-9]+ +[0-9]+ \|" "$DIR/splits.log" | grep -v SDPA | awk '{print $1, $2, $4, $5, $9}' | tr '\n' ';'; echo
timeout 40 ncu --clock-control none --target-processes all -k "regex:decode_attention" -c 4 --section SpeedOfLight \
  python3 profiling/bench_attention.py --ncu-case 8,32768 --nvfp4-variants mma4l > "$DIR/ncu_decode_b8_l32k.txt" 2>&1
echo "ncu decode exit $? (${SECONDS}s)"; grep -E "^  [a-z_0-9]+ \(|Duration|DRAM Throughput" "$DIR/ncu_decode_b8_l32k.txt" | cut -c1-90

limit=$(( ($(left) - 4) / 2 )); [ "$limit" -gt 60 ] && limit=60
sanitize memcheck "$limit" "$DIR/sanitizer_memcheck.log" python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_quantize_kernels.py -k "persistent and guided and v7"
limit=$(( $(left) - 3 )); [ "$limit" -gt 60 ] && limit=60
sanitize racecheck "$limit" "$DIR/sanitizer_racecheck.log" python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_quantize_kernels.py -k "persistent and guided and v7"
