#!/usr/bin/env bash
# The moe_pack kernel (natural NVFP4 -> the MoE GEMM's packed, encoded weights on the GPU; 2026-12-01)
# on the H200 (< 5 min): its GPU tests against the torch path and memcheck on them, the rollout
# engine's GPU tests (its refit now packs with the kernel), and bench_moe_pack (kernel vs torch path,
# both presets). Outputs in $OUT/pk/, tarred to $OUT/pk.tar.
# Usage (repo root; carry .whl): OUT=$OUT bash profiling/device/run_gpu_checks_moe_pack.sh
set -uo pipefail
BUDGET=${BUDGET:-300}
W="$OUT/pk"; mkdir -p "$W"; trap 'tar -cf "$OUT/pk.tar" -C "$W" .' EXIT
source profiling/device/gpu_env.sh "$W/setup.log"
export TRACE_KERNELS_CACHE_DIR=/tmp/tkcache
echo "== build ($(left)s left)"
timeout 90 python3 profiling/prebuild_engine_kernels.py "E=32,H=512,I=256,k=4,hq=8,hkv=2,hd=64:1,8,256,2560" \
  "E=8,H=64,I=64,k=2,hq=4,hkv=2,hd=64:1,4,8,32,40" > "$W/build_engine.log" 2>&1
echo "engine build exit $?"; tail -1 "$W/build_engine.log"
echo "== pack tests ($(left)s left)"
gpu_tests 60 "$W/pack_tests.log" tests/gpu/test_moe_gemm.py -k pack
sanitize memcheck 60 "$W/memcheck.log" python3 -m pytest tests/gpu/test_moe_gemm.py -k "pack and 128" -q -p no:cacheprovider
echo "== engine GPU tests ($(left)s left)"
gpu_tests 100 "$W/engine_tests.log" tests/rl/test_engine_gpu.py tests/rl/test_guidance_capture.py \
  tests/rl/test_engine_kernels.py
t=$(( $(left) - 5 ))
echo "== bench ($(left)s left)"
timeout "$t" python3 profiling/bench_moe_pack.py --out "$W/moe_pack_h200.json" > "$W/bench.log" 2>&1
echo "bench exit $?"; tail -6 "$W/bench.log"
echo "== done ($(left)s left)"
