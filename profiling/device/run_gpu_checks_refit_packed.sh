#!/usr/bin/env bash
# ops.refit_weights_packed_ (the RL weight sync in one op: BF16/FP16/FP32 expert weights -> the MoE GEMM's
# packed, encoded NVFP4 in place; 2026-12-02) on the H200, < 4 min on a fresh machine: build (the op's 6
# kernels, refit's amax kernels, moe_pack, the engine tests' kernels, in parallel), the op's GPU tests
# (bit for bit vs refit_weights + store_fragments_' torch path), compute-sanitizer memcheck and racecheck
# on a small subset, the rollout engine's GPU tests (its refit now runs the op), then bench_moe_pack.py
# --what refit (two-step sync vs the fused op vs a copy, both presets). Outputs in $OUT/rp/, tarred to
# $OUT/rp.tar.
# Usage (repo root; carry .whl): OUT=$OUT bash profiling/device/run_gpu_checks_refit_packed.sh
set -uo pipefail
BUDGET=${BUDGET:-225}
W="$OUT/rp"; mkdir -p "$W"; trap 'tar -cf "$OUT/rp.tar" -C "$W" .' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
export TRACE_KERNELS_CACHE_DIR=/tmp/tkcache
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$W/gpu.txt" 2>&1
echo "== build ($(left)s left)"
timeout 80 python3 - > "$W/build.log" 2>&1 <<'EOF'
import sys, time
sys.path.insert(0, "profiling")
from prebuild_engine_kernels import specs_for
from trace_kernels import jit
from trace_kernels.codegen.ops import moe_pack, refit_packed, refit_weights
t = time.time()
specs = specs_for("E=32,H=512,I=256,k=4,hq=8,hkv=2,hd=64", [1, 8, 256, 2560])
specs += specs_for("E=8,H=64,I=64,k=2,hq=4,hkv=2,hd=64", [1, 4, 8, 32, 40])
specs += [refit_packed.spec(d, g) for d in ("bf16", "f16", "f32") for g in (1, 2)]
specs += [refit_weights.spec(d, "v2") for d in ("bf16", "f16", "f32")] + [moe_pack.spec(1), moe_pack.spec(2)]
specs = list({s.name: s for s in specs}.values())
entries = jit.build_all(specs, jobs=16, keep_going=True)
for s, e in zip(specs, entries):
    print(s.name, "FAILED: " + str(e)[:400] if isinstance(e, BaseException) else "ok")
print(f"built/verified {len(specs)} kernels in {time.time() - t:.1f}s")
EOF
echo "build exit $?"; grep -c FAILED "$W/build.log"; tail -1 "$W/build.log"
for f in /tmp/tkcache/v1/nvfp4_refit_packed_*/ptxas.txt; do
  echo "$(basename "$(dirname "$f")"): $(grep -ho 'Used [0-9]* registers' "$f"), $(grep -ho '[0-9]* bytes stack frame, [0-9]* bytes spill stores, [0-9]* bytes spill loads' "$f" | head -1)"
done > "$W/ptxas.txt"; cat "$W/ptxas.txt"
echo "== refit_packed GPU tests ($(left)s left)"
gpu_tests 60 "$W/tests.log" tests/gpu/test_refit_packed.py --durations=5
SUBSET="(bitexact and 5-192-320) or nonfinite"
sanitize memcheck 40 "$W/memcheck.log" python3 -m pytest tests/gpu/test_refit_packed.py -k "$SUBSET" -q -p no:cacheprovider
sanitize racecheck 40 "$W/racecheck.log" \
  python3 -m pytest tests/gpu/test_refit_packed.py -k "bitexact and 5-192-320" -q -p no:cacheprovider
echo "== engine GPU tests ($(left)s left)"
gpu_tests 60 "$W/engine_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_guidance_capture.py \
  tests/rl/test_engine_kernels.py
t=$(( $(left) - 5 )); t=$(( t > 15 ? t : 15 ))  # timeout 0 would mean no limit
echo "== bench ($(left)s left)"
timeout "$t" python3 profiling/bench_moe_pack.py --what refit --out "$W/refit_packed_h200.json" > "$W/bench.log" 2>&1
echo "bench exit $?"; tail -6 "$W/bench.log"
echo "== done ($(left)s left)"
