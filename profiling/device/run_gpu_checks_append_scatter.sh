#!/usr/bin/env bash
# Tenth session of 2026-12-02 on the H200, one call (every step under `timeout`, BUDGET s): kv_append (the default
# b2_cta128, with and without guidance, and BF16 pages) at random (decode) and contiguous (prefill) slots, beside
# torch index_copy_ of the same rows into the same slot pattern (bench_attention.py --append-only: scatter_writes),
# which says what scattering the writes costs by itself. SLOTS (default random,contiguous) picks the patterns
# (bench_attention.APPEND_SLOTS; the twentieth session added pages), HEADS (default 4x128) the kv heads x head_dim
# (--append-heads), ROUNDS (default 2) the rounds.
# Usage (repo root; carry .whl): OUT=$OUT bash profiling/device/run_gpu_checks_append_scatter.sh -> $OUT/append_scatter.tar
set -uo pipefail
OUT=${OUT:-runs/append_scatter}
BUDGET=${BUDGET:-300}
DIR="$OUT/append_scatter"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/setup.log"

HEADS=${HEADS:-4x128} timeout 120 python3 -c "
import os
from trace_kernels import jit
from trace_kernels.codegen.ops import kv_append
heads = [tuple(int(x) for x in h.split('x')) for h in os.environ['HEADS'].split(',')]
specs = [s for hkv, d in heads for s in (kv_append.spec('nvfp4', hkv, d, 'b2_cta128'), kv_append.spec('bf16', hkv, d))]
print([type(e).__name__ for e in jit.build_all(specs, jobs=2)])
" > "$DIR/build.log" 2>&1
echo "build exit $? (${SECONDS}s)"; tail -1 "$DIR/build.log"
for round in $(seq 1 "${ROUNDS:-2}"); do
  timeout 100 python3 profiling/bench_attention.py --append-only --append-variants b2_cta128 \
    --append-slots "${SLOTS:-random,contiguous}" --append-heads "${HEADS:-4x128}" --out "$DIR/append_scatter$round.json" > "$DIR/append$round.log" 2>&1
  echo "append $round exit $? (${SECONDS}s)"; grep -E "^kv_append|^scatter" "$DIR/append$round.log" | grep 262144 | cut -c1-130
done
