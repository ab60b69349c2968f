#!/usr/bin/env bash
# Tenth session of 2026-12-02 on the H200, one call, every step under `timeout` (BUDGET s):
#   1. build: the KV kernels of the tests (mma4l at every test shape, the new split combine), every memory kernel
#      (spills fail the build: TRACE_KERNELS_PTXAS_CHECK=1) and the base tree's decode kernels (BASE: a copy of
#      the previous commit's python/, cuda/, codegen/ and bench scripts), in parallel
#   2. the KV GPU tests (decode against the reference at every split count, CUDA graphs) and v7's guided tests
#   3. decode A/B: mma4l on the base tree (one thread per element walks the splits) and on this one (warps take
#      whole split rows, launched as a programmatic dependent), two rounds each, the four decode cases
#   4. guided v7 in every mode (full guidance with counters now 2 x 256 threads per SM), 64 / 256 / 1024 MB
#   5. Nsight Compute: the decode kernel and the combine at (B, L) = (8, 32K); guided v7 compact with counters
#   6. compute-sanitizer memcheck and racecheck on the split decode tests
# Usage (repo root; carry .whl, .ab_base): OUT=$OUT BASE=.ab_base bash profiling/device/run_gpu_checks_decode_combine.sh
#   -> $OUT/decode_combine.tar
set -uo pipefail
OUT=${OUT:-runs/decode_combine}
BUDGET=${BUDGET:-570}
BASE=${BASE:-.ab_base}
DIR="$OUT/decode_combine"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/setup.log"

TRACE_KERNELS_PTXAS_CHECK=1 timeout 200 python3 profiling/prebuild_memory_kernels.py --jobs 6 \
  nvfp4_guided_fake_quantize_bf16_v7 > "$DIR/build_memory.log" 2>&1 &
PYTHONPATH=/tmp/site:$PWD/$BASE/python timeout 200 python3 "$BASE/profiling/bench_attention.py" --build-only 2 \
  --nvfp4-variants mma4l --build-named-only --bf16-variants "" > "$DIR/build_base.log" 2>&1 &
TRACE_KERNELS_PTXAS_CHECK=1 timeout 200 python3 profiling/bench_attention.py --build-only 8 --nvfp4-variants mma4l \
  > "$DIR/build_kv.log" 2>&1
echo "kv build exit $? (${SECONDS}s)"; grep -E "FAILED|combine|kernels built" "$DIR/build_kv.log" | grep -v "_mb12_" | tail -4
wait
echo "memory build (${SECONDS}s):"; grep -E "FAILED|_d2048|built" "$DIR/build_memory.log" | grep -v "_mb12_" | cut -c1-150 | tail -5
tail -1 "$DIR/build_base.log"

gpu_tests 170 "$DIR/kv_tests.log" tests/gpu/test_kv_kernels.py
gpu_tests 40 "$DIR/guided_tests.log" tests/gpu/test_quantize_kernels.py -k "guided and v7"

for round in 1 2; do
  for tree in base new; do
    if [ "$tree" = new ]; then py=$PWD/python; script=profiling/bench_attention.py
    else py=$PWD/$BASE/python; script=$BASE/profiling/bench_attention.py; fi
    PYTHONPATH=/tmp/site:$py:$PWD/rl timeout 45 python3 "$script" --decode-only --nvfp4-variants mma4l \
      --bf16-variants "" --out "$DIR/attention_${tree}$round.json" > "$DIR/decode_${tree}$round.log" 2>&1
    echo "decode $tree $round exit $? (${SECONDS}s)"
    grep -E "^ +[0-9]+ +[0-9]+ \|" "$DIR/decode_${tree}$round.log" | grep -v SDPA | awk '{print $1, $2, $4, $8}' | tr '\n' ';'
    echo
  done
done

timeout 70 python3 profiling/bench_memory_kernels.py --select guided_fake_quantize:v7 --sizes-mb 64,256,1024 \
  --copy-study-mb "" --no-host-overhead --out "$DIR/guided_v7_final.json" > "$DIR/bench_guided.log" 2>&1
echo "guided bench exit $? (${SECONDS}s)"
grep -E "^guided|^copy" "$DIR/bench_guided.log" | sed "s/guided_fake_quantize //" | tr -s " " | cut -c1-70

timeout 40 ncu --clock-control none --target-processes all -k "regex:decode_attention" -c 4 --section SpeedOfLight \
  python3 profiling/bench_attention.py --ncu-case 8,32768 --nvfp4-variants mma4l > "$DIR/ncu_decode_b8_l32k.txt" 2>&1
echo "ncu decode exit $? (${SECONDS}s)"; grep -E "^  [a-z_0-9]+ \(|Duration|DRAM Throughput" "$DIR/ncu_decode_b8_l32k.txt" | cut -c1-90
limit=$(( $(left) > 150 ? 45 : $(left) - 100 ))
[ "$limit" -ge 20 ] && ncu_report "$DIR/ncu_guided_compact_counters" "$limit" "nvfp4_guided" \
  python3 profiling/ncu_memory_case.py guided-compact-counters:v7 --mb 64

limit=$(( ($(left) - 4) / 2 )); [ "$limit" -gt 60 ] && limit=60
sanitize memcheck "$limit" "$DIR/sanitizer_memcheck.log" python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_kv_kernels.py -k "(test_decode_attention_growing_scores_and_special_rows or test_decode_attention_cuda_graph) and mma4l"
limit=$(( $(left) - 3 )); [ "$limit" -gt 60 ] && limit=60
sanitize racecheck "$limit" "$DIR/sanitizer_racecheck.log" python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_kv_kernels.py -k "test_decode_attention_growing_scores_and_special_rows and mma4l"
