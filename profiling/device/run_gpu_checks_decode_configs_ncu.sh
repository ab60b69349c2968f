#!/usr/bin/env bash
# A record: it names memory-kernel variants removed on 2026-12-05 (refit_weights v1, v3-v7, v10, v11; quantize v1,
# v4; guided_fake_quantize v1-v6 as variants), so it runs as written only on commit 32f5e89 or earlier.
# Ninth session of 2026-12-02, last call on the H200 (every step under `timeout`, BUDGET s):
#   1. decode: mma4l against the configurations the sweep left out (4 warps per kv head in one 512-thread CTA,
#      3 stages), two rounds (built with TRACE_KERNELS_PTXAS_CHECK=1)
#   2. Nsight Compute on what the memory targets still miss: guided v7 compact with counters, v4's full guidance
#      with counters, v7 full without counters (met, for contrast), 64 MB (profiling/ncu_memory_case.py)
#   3. Nsight Compute on the decode default (mma4l) at (B, L) = (32, 32K)
# Usage (repo root; carry .whl): OUT=$OUT bash profiling/device/run_gpu_checks_decode_configs_ncu.sh -> $OUT/decode_ncu.tar
set -uo pipefail
OUT=${OUT:-runs/decode_ncu}
BUDGET=${BUDGET:-330}
DIR="$OUT/decode_ncu"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/setup.log"
CONFIGS=${CONFIGS:-mma4l,mma4l_w4s2,mma4l_w2s3,mma4l_w1s2}

TRACE_KERNELS_PTXAS_CHECK=1 timeout 90 python3 profiling/bench_attention.py --build-only 16 --nvfp4-variants "$CONFIGS" \
  --build-named-only --bf16-variants "" > "$DIR/build.log" 2>&1
echo "build exit $? (${SECONDS}s)"; grep -E "hq32_hkv4_d128|FAILED" "$DIR/build.log" | cut -c1-130
for round in 1 2; do
  timeout 60 python3 profiling/bench_attention.py --decode-only --nvfp4-variants "$CONFIGS" --bf16-variants "" \
    --out "$DIR/attention_configs$round.json" > "$DIR/configs$round.log" 2>&1
  echo "configs $round exit $? (${SECONDS}s)"
  grep -E "^ +[0-9]+ +[0-9]+ \|" "$DIR/configs$round.log" | grep -v SDPA | awk '{print $1, $2, $4, $5}' | tr '\n' ';'; echo
done

for c in guided-compact-counters:v7 guided-full:v4 guided-full-nocounters:v7; do
  limit=$(( $(left) > 100 ? 45 : $(left) - 50 )); [ "$limit" -lt 20 ] && { echo "ncu $c: skipped"; continue; }
  ncu_report "$DIR/ncu_${c//[:+-]/_}" "$limit" "nvfp4_guided" python3 profiling/ncu_memory_case.py "$c" --mb 64
done
limit=$(( $(left) - 5 ))
[ "$limit" -ge 25 ] && ncu_report "$DIR/ncu_mma4l_b32_l32k" "$limit" "decode_attention_nvfp4_mma4l_hq" \
  python3 profiling/bench_attention.py --ncu-case 32,32768 --nvfp4-variants mma4l
