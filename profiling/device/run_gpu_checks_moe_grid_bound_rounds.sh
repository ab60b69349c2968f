#!/usr/bin/env bash
# More rounds of run_gpu_checks_moe_grid_bound.sh's layer A/B where it moved or might: T = 1, 2, 8, 32 on both presets,
# auto (moe_routing.token_tile_bound) against auto:loose (ceil(M / TN) + E) and auto:exact (the real token tiles),
# four rounds in one call, the arms' order rotated each round (30B T=8 was 1-2% slower on the new bound in both rounds
# of the first call, on an H100; T=1 3-5% faster).
# Usage (repo root; carry .whl, .tkcache_moe): TRACE_KERNELS_BENCH_COMMIT=<commit> OUT=$OUT [BUDGET=200] \
#     bash profiling/device/run_gpu_checks_moe_grid_bound_rounds.sh
#   -> $OUT/moe_grid_bound_rounds.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_grid_bound_rounds 200

moe_build_ab "$DIR" auto
arms=(auto auto:loose auto:exact)
for round in 1 2 3 4; do
  [ "$(left)" -lt 40 ] && break
  order=$(printf '%s\n' "${arms[@]:$(( round % 3 ))}" "${arms[@]:0:$(( round % 3 ))}" | paste -sd,)
  layer_ab_round "$DIR" "$round" 60 --variants "$order" --tokens 1,2,8,32
done
echo "== done ($(left)s left)"
