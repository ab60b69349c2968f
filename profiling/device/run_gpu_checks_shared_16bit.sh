#!/usr/bin/env bash
# The forty-ninth session's header refactor on a GPU (any card): vec.cuh's 16-bit Vec8 members in one template
# (Vec8Packed16), quantize_epilogue.cuh's Pair16 as one template, guided v3's and v4's shared pass tail
# (guided_pass_tail), and the KV tests' decode bound in one helper. same_sass.py found the memory, KV and engine
# kernels' SASS unchanged but for the eight FP16 guided v7 audit kernels (registers renamed); this call runs the tests
# of every kernel those headers reach except the MoE GEMMs (whose SASS is compared on the CPU):
#   1. the memory kernels' and the packed refit's GPU tests, the KV GPU tests, the RL layer's GPU tests
#   2. compute-sanitizer memcheck and racecheck on issue 3's sanitizer subset (guided v7 FP16 among them)
# Usage (repo root; carry .whl and .tkcache, built by
#   python profiling/prebuild_device_caches.py --cache .tkcache memory kv engine):
#   OUT=$OUT [BUDGET=400] bash profiling/device/run_gpu_checks_shared_16bit.sh      -> $OUT/shared_16bit.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call shared_16bit 400 .tkcache
nvidia-smi --query-gpu=name --format=csv,noheader

gpu_tests 110 "$DIR/quantize_gpu_tests.log" tests/gpu/test_quantize_kernels.py tests/gpu/test_refit_packed.py
gpu_tests 120 "$DIR/kv_gpu_tests.log" tests/gpu/test_kv_kernels.py
gpu_tests 60 "$DIR/rl_gpu_tests.log" -m gpu tests/rl
SUBSET="not large and (bitexact or nonfinite or sequence or many_rows or grid_edges) and (1-16 or 17-768 or 5-33-96 or
  7-64 or 40-8-32 or nonfinite or grid_edges)"
SUBSET=${SUBSET//$'\n'/ }
limit=$(( ($(left) - 10) / 2 )); [ "$limit" -gt 60 ] && limit=60
for tool in memcheck racecheck; do
  [ "$limit" -gt 20 ] && sanitize "$tool" "$limit" "$DIR/$tool.log" \
    python3 -m pytest tests/gpu/test_quantize_kernels.py -q -p no:cacheprovider -k "$SUBSET"
done
echo "== done ($(left)s left)"
