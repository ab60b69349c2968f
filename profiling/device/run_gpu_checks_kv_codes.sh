#!/usr/bin/env bash
# A record: it names decode-attention variants removed on 2026-12-05 (simt, mma on NVFP4 pages, mma2 and its
# sweep configurations, mma3, mma4), so it runs as written only on commit 9d9c541 or earlier.
# Issue 5: the NVFP4 KV cache's encoded code words (kv_codes.py / kv_codes.cuh) on the H200, one call
# (<= BUDGET s, every step under `timeout`). STEPS (default "build tests engine sanitize ab append ncu") picks:
#   build:    this tree's KV kernels (registers / spills) and the base tree's decode kernels
#   tests:    every KV GPU test (append bit-exact, decode variants, guidance, CUDA graph, non-finite rows)
#   engine:   the rollout engine's GPU tests (kernel pages written by kv_append, read by decode attention and,
#             for full guidance, by kv_codes.decode_codes), after building the engine's kernels of both test models
#   sanitize: compute-sanitizer memcheck and racecheck on small append and decode cases
#   ab:       the decode benchmark (mma2_w2s2, mma4) of BASE (a carried copy of the previous commit's
#             python/, cuda/, codegen/, profiling/) and of this tree, twice in turn, same call
#   append:   kv_append (default variant, random and contiguous slots) of both trees, same call
#   sweep:    this tree's decode benchmark over SWEEP (mma4 / mma2 configurations, lazy rescaling), SWEEP_ROUNDS times
#   ncu:      Nsight Compute on this tree's default decode kernel (mma4) at (B, L) = (32, 32K)
# Everything goes to $OUT/kvc/, tarred to $OUT/kvc.tar at the end.
# Usage (repo root, carry .whl and BASE): OUT=$OUT BASE=.ab_base bash profiling/device/run_gpu_checks_kv_codes.sh
set -uo pipefail
OUT=${OUT:-runs/kv_codes}
BUDGET=${BUDGET:-560}
BASE=${BASE:-.ab_base}
STEPS=${STEPS:-build tests engine sanitize ab append ncu}
VARIANTS=${VARIANTS:-mma2_w2s2,mma4}
SWEEP=${SWEEP:-mma4,mma4l,mma4_w1s2,mma4l_w1s2,mma4_w1s3,mma2_w2s2,mma2_w1s2,mma3_w1s3}
A="$OUT/kvc"
mkdir -p "$A"
source profiling/device/gpu_env.sh "$A/setup.log"
tar_on_exit "$A"
log_machine "$A/setup.log"
has() { [[ " $STEPS " == *" $1 "* ]]; }
base_py() { PYTHONPATH=/tmp/site:$PWD/$BASE/python TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_base timeout "$@"; }

if has build; then
  TRACE_KERNELS_PTXAS_CHECK=1 timeout 150 python3 profiling/bench_attention.py --build-only 16 \
    --nvfp4-variants "${BUILD_VARIANTS:-simt,mma,mma2,mma3,sweep,sweep4}" > "$A/build.log" 2>&1
  echo "build exit: $? (${SECONDS}s)" | tee -a "$A/build.log"; grep -E "(mma2_w2s2|mma4)_hq32_hkv4_d128|kv_append" "$A/build.log" | head -6
  [ -d "$BASE" ] && base_py 120 python3 "$BASE/profiling/bench_attention.py" --build-only 16 --nvfp4-variants "$VARIANTS" \
    --build-named-only --bf16-variants "" > "$A/build_base.log" 2>&1
  echo "base build exit: $? (${SECONDS}s)"; grep -E "hq32_hkv4_d128" "$A/build_base.log"
fi

if has tests; then
  gpu_tests 200 "$A/gpu_tests.log" tests/gpu/test_kv_kernels.py -x --durations=8
fi

if has engine; then
  prebuild_engine_test_models 150 "$A/build_engine.log"
  echo "engine prebuild exit: $? (${SECONDS}s)"; tail -1 "$A/build_engine.log"
  gpu_tests $(( $(left) > 300 ? 260 : $(left) - 40 )) "$A/engine_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_guidance_capture.py \
    tests/rl/test_engine_kernels.py
fi

if has sanitize; then
  for tool in memcheck racecheck; do
    sanitize $tool $(( $(left) > 240 ? 60 : 20 )) "$A/sanitizer_$tool.log" python3 -m pytest tests/gpu/test_kv_kernels.py \
      -q -p no:cacheprovider -x -k "test_decode_ignores_bytes_past_the_end and (lengths0-32-4-128-16-mma2-3 or lengths1-8-1-64-64-mma4-None) or test_kv_append_bit_exact and lengths1-4-128-64-nvfp4-b2_cta128"
  done
fi

if has ab; then
  for round in 1 2; do
    for tree in base new; do
      limit=$(( $(left) > 100 ? 60 : $(left) - 30 ))
      [ "$limit" -lt 20 ] && { echo "ab $tree $round: skipped, $(left)s left"; continue; }
      json="$A/attention_kv_codes_${tree}${round}.json"
      if [ "$tree" = new ]; then
        timeout "$limit" python3 profiling/bench_attention.py --decode-only --nvfp4-variants "$VARIANTS" --bf16-variants "" \
          --out "$json" > "$A/bench_${tree}${round}.log" 2>&1
      else
        base_py "$limit" python3 "$BASE/profiling/bench_attention.py" --decode-only --nvfp4-variants "$VARIANTS" \
          --bf16-variants "" --out "$json" > "$A/bench_${tree}${round}.log" 2>&1
      fi
      echo "ab $tree $round exit $? (${SECONDS}s)"
      grep -E "^ +[0-9]+ +[0-9]+ \||nvfp4" "$A/bench_${tree}${round}.log" | grep -v '^{' | tail -12
    done
  done
fi

if has append; then
  for tree in base new; do
    limit=$(( $(left) > 100 ? 60 : $(left) - 30 ))
    [ "$limit" -lt 20 ] && { echo "append $tree: skipped"; continue; }
    json="$A/kv_append_kv_codes_${tree}.json"
    if [ "$tree" = new ]; then
      timeout "$limit" python3 profiling/bench_attention.py --append-only --append-variants b2_cta128 \
        --append-slots random,contiguous --out "$json" > "$A/append_${tree}.log" 2>&1
    else
      base_py "$limit" python3 "$BASE/profiling/bench_attention.py" --append-only --append-variants b2_cta128 \
        --append-slots random,contiguous --out "$json" > "$A/append_${tree}.log" 2>&1
    fi
    echo "append $tree exit $? (${SECONDS}s)"; grep -v '^{' "$A/append_${tree}.log" | tail -8
  done
fi

if has sweep; then
  for round in $(seq 1 "${SWEEP_ROUNDS:-2}"); do
    limit=$(( $(left) > 120 ? 90 : $(left) - 10 ))
    [ "$limit" -lt 20 ] && { echo "sweep $round: skipped, $(left)s left"; continue; }
    timeout "$limit" python3 profiling/bench_attention.py --decode-only --nvfp4-variants "$SWEEP" --bf16-variants "" \
      --out "$A/attention_kv_codes_sweep${round}.json" > "$A/sweep${round}.log" 2>&1
    echo "sweep $round exit $? (${SECONDS}s)"
    grep -E "^ +[0-9]+ +[0-9]+ \|" "$A/sweep${round}.log" | grep -E " 32768 | 131072 " | awk '{print $1, $2, $4, $5}' | tr '\n' ';'; echo
  done
fi

if has ncu; then
  limit=$(( $(left) - 12 ))
  if [ "$limit" -ge 25 ]; then
    ncu_report "$A/ncu_mma4_b32_l32k" "$limit" "decode_attention_nvfp4_mma4_hq" \
      python3 profiling/bench_attention.py --ncu-case 32,32768 --nvfp4-variants mma4
  else
    echo "ncu: skipped, $(left)s left"
  fi
fi
