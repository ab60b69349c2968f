#!/usr/bin/env bash
# Attention and MoE shapes other than the Qwen3 presets (written in the twenty-seventh session, 2026-12-04, without a
# device; not yet run), one call, every step under `timeout` (BUDGET s):
#   1. the decode GPU tests of the GQA 5 and 12 cases (every kernel, every split setting) and memcheck on mma4l's;
#      the MoE GPU test of auto's tiles at a shape whose K chunks are odd in number (H = 576, I = 320), memcheck on it
#   2. bench_attention.py --decode-only at --heads 40x8x128x16 (Llama 4's attention: GQA 5, 8 kv heads, where the
#      default mma4l runs one 512-thread CTA per SM) for mma4l, its one-warp-per-kv-head configuration and mma2_w2s2,
#      BF16 mma and SDPA; then at 96x8x128x16 (GLM-4.5: GQA 12, two CTAs of 6 heads per kv head) for mma4l and
#      mma2_w2s2
#   3. bench_moe_gemm.py (auto against BF16 _grouped_mm) at gpt-oss-120b's MoE shape (E=128, H=I=2880, top-4) and
#      Mixtral-8x7B's (E=8, H=4096, I=14336, top-2), T = 8 / 64 / 256 / 4096
# Its kernels, built here beforehand (nvcc 13.0) into the ignored .tkcache_shapes: moe_prebuild.py --tables auto
# --no-extras for the two MoE shapes of step 3 and the odd-chunk test shape, and the decode kernels of steps 1-2.
# Usage (repo root; carry .whl, .tkcache_shapes): OUT=$OUT bash profiling/device/run_gpu_checks_other_shapes.sh
#   .tkcache_shapes: python profiling/prebuild_device_caches.py --cache .tkcache_shapes kv other_shapes
#   -> $OUT/other_shapes.tar
set -uo pipefail
OUT=${OUT:-runs/other_shapes}
BUDGET=${BUDGET:-570}
DIR="$OUT/other_shapes"
mkdir -p "$DIR"
export TRACE_KERNELS_CACHE_DIR=${TRACE_KERNELS_CACHE_DIR:-$PWD/.tkcache_shapes}
export TRACE_KERNELS_MOE_BUILTIN_TABLES=${TRACE_KERNELS_MOE_BUILTIN_TABLES:-0}  # auto's own tables, as its 2026-12-05 H100 run measured (1: the tables shipped since)
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"

gqa="matches_reference and (10-2-128 or 24-2-64)"
gpu_tests 150 "$DIR/gqa_tests.log" -m gpu tests/gpu/test_kv_kernels.py -k "$gqa"
sanitize memcheck 60 "$DIR/gqa_memcheck.log" python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/gpu/test_kv_kernels.py -k "$gqa and mma4l"
gpu_tests 120 "$DIR/moe_odd_tests.log" -m gpu tests/gpu/test_moe_gemm.py -k odd_chunk
sanitize memcheck 90 "$DIR/moe_odd_memcheck.log" python3 -m pytest -q -p no:cacheprovider -m gpu \
  "tests/gpu/test_moe_gemm.py::test_auto_tiles_at_odd_chunk_counts[8]" \
  "tests/gpu/test_moe_gemm.py::test_auto_tiles_at_odd_chunk_counts[300]"

timeout 150 python3 profiling/bench_attention.py --decode-only --heads 40x8x128x16 \
  --nvfp4-variants mma4l,mma4l_w1s2,mma2_w2s2 --bf16-variants mma --out "$DIR/attention_llama4_heads.json" \
  > "$DIR/attention_llama4_heads.log" 2>&1
echo "attention 40x8 exit $? (${SECONDS}s)"; grep -E "\| +(nvfp4|bf16)" "$DIR/attention_llama4_heads.log" | head -20
timeout 100 python3 profiling/bench_attention.py --decode-only --heads 96x8x128x16 \
  --nvfp4-variants mma4l,mma2_w2s2 --bf16-variants mma --out "$DIR/attention_glm_heads.json" \
  > "$DIR/attention_glm_heads.log" 2>&1
echo "attention 96x8 exit $? (${SECONDS}s)"; grep -E "\| +(nvfp4|bf16)" "$DIR/attention_glm_heads.log" | head -12

limit=$(( $(left) - 10 ))
timeout "$limit" python3 profiling/bench_moe_gemm.py --variants auto --reps 10 --tokens 8,64,256,4096 \
  --shapes 'E=128,H=2880,I=2880,k=4,hq=64,hkv=8,hd=64;E=8,H=4096,I=14336,k=2,hq=32,hkv=8,hd=128' \
  --out "$DIR/moe_gemm_other_shapes.json" > "$DIR/moe_gemm_other_shapes.log" 2>&1
echo "moe exit $? (limit ${limit}s, ${SECONDS}s)"; tail -12 "$DIR/moe_gemm_other_shapes.log"
echo "== done ($(left)s left)"
