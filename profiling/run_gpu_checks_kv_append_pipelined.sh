#!/usr/bin/env bash
# kv_append's persistent, software-pipelined variants ("p": b1p, b2p, b2p_cta128) against b2 and
# b2_cta128 on the H200 (< 6 min): the append GPU tests (bit-exact, guidance, non-finite rows, grids
# capped so each CTA walks many tiles), bench_attention --append-only over those variants (64K and 256K
# tokens, copy bandwidth in the same run), memcheck and racecheck on the "p" tests, Nsight Compute on
# b2p at 256K tokens. Outputs in $OUT/kvp/, packed into $OUT/kvp.tar.
# Usage (repo root; carry .whl and .tkcache): OUT=$OUT bash profiling/run_gpu_checks_kv_append_pipelined.sh
set -uo pipefail
OUT=${OUT:-runs/kv_append_pipelined}
BUDGET=${BUDGET:-330}
VARIANTS=${VARIANTS:-b2,b2_cta128,b1p,b2p,b2p_cta128}
W="$OUT/kvp"
mkdir -p "$W"
source profiling/gpu_env.sh "$W/setup.log"
tar_on_exit "$W"

echo "== append GPU tests ($(left)s left)"
gpu_tests 150 "$W/kv_append_tests.log" tests/gpu/test_kv_kernels.py -k append

echo "== bench ($(left)s left)"
timeout 120 python3 profiling/bench_attention.py --append-only --append-variants "$VARIANTS" \
  --out "$W/kv_append_pipelined_h200.json" > "$W/kv_append_bench.log" 2>&1
echo "bench exit $?"; grep -E "copy|kv_append" "$W/kv_append_bench.log"

echo "== sanitizers on the pipelined tests ($(left)s left)"
sanitize memcheck 60 "$W/kv_append_memcheck.log" python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kv_kernels.py \
  -k "append and (pipelined or b2p or b1p)"
sanitize racecheck 40 "$W/kv_append_racecheck.log" python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kv_kernels.py \
  -k "pipelined_loops and b2p and 3"

t=$(( $(left) - 10 ))
if [ "$t" -gt 30 ]; then
  echo "== ncu b2p, 256K tokens (${t}s)"
  ncu_report "$W/ncu_kv_append_b2p" "$t" kv_append --launch-skip 1 python3 profiling/ncu_memory_case.py kv_append:b2p
fi
echo "== done ($(left)s left)"
