#!/usr/bin/env bash
# Tuned MoE tile tables (trace_kernels.moe_tables) at two shapes auto's tables were not tuned on (thirty-second session,
# 2026-12-05, written without a device; not yet run): gpt-oss-120b's MoE (E=128, H=I=2880, top-4) and Mixtral-8x7B's
# (E=8, H=4096, I=14336, top-2). One call, every step under `timeout` (BUDGET s):
#   1. the tuned-tables GPU test (a table's tiles run, the layer's bits equal auto's) and the odd-chunk auto test
#   2. per shape: sweep_moe_gemm_tiles.py --tiles tuning at T = 8, 64, 256, 1024, 4096, writing a tables file
#   3. per shape: bench_moe_gemm.py --variants auto at the same T without and with TRACE_KERNELS_MOE_TABLES set to that
#      file (two processes, same seeds), then both again in the other order while time is left
# Usage (repo root; carry .whl, .tkcache_shapes): OUT=$OUT bash profiling/device/run_gpu_checks_moe_tuned_tables.sh
#   .tkcache_shapes: python profiling/prebuild_device_caches.py --cache .tkcache_shapes other_shapes tuning
#   -> $OUT/moe_tuned_tables.tar
set -uo pipefail
OUT=${OUT:-runs/moe_tuned_tables}
BUDGET=${BUDGET:-570}
DIR="$OUT/moe_tuned_tables"
mkdir -p "$DIR"
export TRACE_KERNELS_CACHE_DIR=${TRACE_KERNELS_CACHE_DIR:-$PWD/.tkcache_shapes}
unset TRACE_KERNELS_MOE_TABLES
export TRACE_KERNELS_MOE_BUILTIN_TABLES=0  # the auto arm runs auto's own tables (these shapes' built-ins came from this run)
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"

gpu_tests 120 "$DIR/tuned_tests.log" -m gpu tests/gpu/test_moe_gemm.py -k "tuned or odd_chunk"

TOKENS=8,64,256,1024,4096
declare -A SHAPE=([gptoss]="E=128,H=2880,I=2880,k=4,hq=64,hkv=8,hd=64"
                  [mixtral]="E=8,H=4096,I=14336,k=2,hq=32,hkv=8,hd=128")
for name in gptoss mixtral; do
  timeout 110 python3 profiling/sweep_moe_gemm_tiles.py --shape "${SHAPE[$name]}" --tokens "$TOKENS" --tiles tuning \
    --reps 5 --out "$DIR/moe_tuning_sweep_$name.json" --write-tables "$DIR/moe_tables_$name.json" \
    > "$DIR/sweep_$name.log" 2>&1
  echo "sweep $name exit $? (${SECONDS}s)"; grep -E "best|tables for" "$DIR/sweep_$name.log" | cut -c1-220
done

bench() {  # bench NAME ARM LIMIT: ARM auto (auto's tables) or tuned (the sweep's file)
  local tables=""
  [ "$2" = tuned ] && tables="$DIR/moe_tables_$1.json"
  [ "$2" = tuned ] && [ ! -f "$tables" ] && { echo "no tables for $1"; return; }
  TRACE_KERNELS_MOE_TABLES="$tables" timeout "$3" python3 profiling/bench_moe_gemm.py --variants auto --reps 10 \
    --tokens "$TOKENS" --shapes "${SHAPE[$1]}" --out "$DIR/moe_gemm_${1}_$2_$round.json" \
    > "$DIR/bench_${1}_$2_$round.log" 2>&1
  echo "bench $1 $2 round $round exit $? (${SECONDS}s)"; tail -6 "$DIR/bench_${1}_$2_$round.log"
}
round=1
for name in gptoss mixtral; do bench "$name" auto 70; bench "$name" tuned 70; done
round=2
for name in gptoss mixtral; do
  [ "$(left)" -gt 150 ] || break
  bench "$name" tuned 70; bench "$name" auto 70
done
echo "== done ($(left)s left)"
