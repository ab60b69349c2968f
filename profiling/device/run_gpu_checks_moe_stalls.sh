#!/usr/bin/env bash
# Why the decode MoE GEMMs issue only every ~2 cycles with ~1 eligible warp (ncu, 2026-12-01): build
# the qwen3-30b-a3b T=64 kernels of both variants (table tiles) in parallel, dump the SASS of the
# fused gate_up kernels, and run Nsight Compute with every warp-stall reason (per issued instruction)
# and the source-level stall sampling. Outputs in $OUT/st/, tarred to $OUT/st.tar (< 5 min).
# Usage (repo root; carry .whl): OUT=$OUT bash profiling/device/run_gpu_checks_moe_stalls.sh
set -uo pipefail
BUDGET=${BUDGET:-300}
W="$OUT/st"; mkdir -p "$W"; trap 'tar -cf "$OUT/st.tar" -C "$W" .' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
export TRACE_KERNELS_CACHE_DIR=/tmp/tkcache
echo "== build ($(left)s left)"
timeout 150 python3 - > "$W/build.log" 2>&1 <<'PY'
from concurrent.futures import ThreadPoolExecutor
from trace_kernels import jit, shapes
from trace_kernels.codegen.ops import moe_gemm as cg
shape = shapes.preset("qwen3-30b-a3b")
specs = [cg.gemm_spec(shape, kind, cg.TILE_TABLES[v][0][1]) for v in ("v1", "ws") for kind in ("gate_up_swiglu", "down_routed")]
specs.append(cg.combine_spec(shape))
with ThreadPoolExecutor(8) as pool:
    for spec, entry in zip(specs, pool.map(jit.build, specs)):
        print(spec.name, entry.cubin)
PY
echo "build exit $?"
for c in $(grep -o "/tmp/tkcache/[^ ]*gate_up_swiglu[^ ]*kernel.cubin" "$W/build.log"); do
  name=$(basename "$(dirname "$c")"); cuobjdump --dump-sass "$c" > "$W/${name%%-*}.sass" 2>&1; done
ls "$W"
for v in ws v1; do
  echo "== ncu T=64 $v ($(left)s left)"
  timeout $(( $(left) / 2 )) ncu --clock-control none --kernel-name regex:moe_gemm_ --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section SourceCounters \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    python3 profiling/moe_gemm_ncu_case.py --shape qwen3-30b-a3b --tokens 64 --variant $v > "$W/ncu_$v.log" 2>&1
  echo "ncu exit $?"; grep -E "Duration|Issued Warp|stalled_" "$W/ncu_$v.log" | awk '$NF+0 > 0.2 || /Duration|Issued/' | head -40
done
echo "== done ($(left)s left)"
