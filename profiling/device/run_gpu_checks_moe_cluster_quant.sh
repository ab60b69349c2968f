#!/usr/bin/env bash
# The fused SwiGLU epilogue quantizing in a thread-block cluster (TileConfig.cluster_quant, fifty-third session;
# written, compiled and CPU-tested before this call): a token tile's N / (64 x warpgroups) CTAs are one cluster (30B's
# gate_up: 12, a non-portable size); each CTA folds its part of each row's amax into its own shared memory, reads the
# other CTAs' parts after a cluster barrier and quantizes its own columns of h, so the fused gate_up needs neither the
# quantize launch after it (auto's decode tiles, quantize_after: +4% to +9% over the plain GEMM on 30B at T=8-256 on
# the H200, fifty-second session) nor a last CTA's serial quantization. "auto_cq" is auto with its 30B fused decode
# tiles clustered (T=32-1024; T=8 keeps auto's one-warpgroup tile, 24 CTAs; 235B's 24 CTAs do not fit a cluster: the
# same kernels in both arms, a control). One call (BUDGET s):
#   1. the cluster tiles' GPU tests (bitwise against the same tiles quantized afterwards on tiny and 30B, T=1 to 4096;
#      the 30B layer on auto_cq against auto, with PDL and replayed from a CUDA graph; a non-finite row's report)
#   2. the layer, auto against auto_cq, two rounds with the arms' order reversed, T = TOKENS
#   3. with the time left: memcheck and racecheck on the cluster tiles at T=64 (tiny and 30B)
# Usage (repo root; carry .whl, .tkcache_cq): OUT=$OUT [BUDGET=540] [TOKENS=8,32,64,128,256,1024] \
#     bash profiling/device/run_gpu_checks_moe_cluster_quant.sh
#   .tkcache_cq: python profiling/prebuild_device_caches.py --cache .tkcache_cq moe_cluster
#   -> $OUT/moe_cluster_quant.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_cluster_quant 540 .tkcache_cq

gpu_tests 160 "$DIR/cluster_gpu_tests.log" tests/gpu/test_moe_gemm.py -k "cluster or auto_cq"
layer_ab_swapped "$DIR" 120 130 auto,auto_cq --tokens "${TOKENS:-8,32,64,128,256,1024}"
for tool in memcheck racecheck; do
  limit=$(( $(left) - 5 )); [ "$limit" -gt 60 ] && limit=60
  [ "$limit" -gt 20 ] && sanitize "$tool" "$limit" "$DIR/sanitizer_$tool.log" python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_moe_gemm.py -k "test_cluster_quant_tiles_equal_quantize_after and 64"
done
echo "== done ($(left)s left)"
