"""Codegen for `nvfp4_quantize`: row quantization of x [rows, D], one kernel per (dtype, D, variant).

Variants (cuda/include/trace_kernels/quantize.cuh): "v1" half blocks per thread (measured on the
H200, docs/toolchain.md), "v2" whole blocks per thread (per-block work once per 16 elements, 2x the
bytes in flight). `VARIANT` is what the op launches; the benchmark A/B-tests every one of VARIANTS.
"""

from __future__ import annotations

import functools

from trace_kernels.codegen.registry import OpCodegen
from trace_kernels.codegen.spec import CUDA_TYPES, KernelSpec, dtype_name, kernel_name, resolve_variant, variant_parts
from trace_kernels.shapes import ModelShape

NAME = "nvfp4_quantize"
TEMPLATE = "nvfp4_quantize.cu.jinja"
MIN_CTA = 256
VARIANTS = ("v1", "v2")
VARIANT = "v2"  # the default launch: fastest in the same-run A/B of 2026-11-29 (profiling/run_gpu_checks_issue3.sh), bit-exact


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def check_variant(variant: str | None) -> str:
    return resolve_variant(NAME, VARIANTS, VARIANT, variant)  # VARIANT read at call time (tests patch it)


def tiling(dtype, d: int, variant: str = "v1") -> tuple[int, int]:
    """(threads per row, threads per block) for rows of d elements.

    v1: ~4 half blocks (64 B of 16-bit input) per thread; v2: ~4 whole blocks (128 B; 2 for FP32)
    per thread, so a 2048-wide BF16 row is one warp (no shared-memory reduction).
    """
    units = d // 8 if variant == "v1" else d // 16
    per_thread = 2 if variant == "v2" and dtype_name(dtype) == "f32" else 4  # v2 FP32: 128 B, as 16-bit
    tpr = min(1024, max(2 if variant == "v1" else 1, _pow2_ceil(-(-units // per_thread))))
    return tpr, max(tpr, MIN_CTA)


def spec(dtype, d: int, variant: str | None = None) -> KernelSpec:
    return _spec(dtype, d, check_variant(variant))


# memoized: the ops build their spec on every launch; spec() resolves the variant first, since VARIANT may change
@functools.lru_cache(maxsize=None)
def _spec(dtype, d: int, variant: str) -> KernelSpec:
    if d <= 0 or d % 16:
        raise ValueError(f"{NAME}: D={d} must be a positive multiple of 16")
    short = dtype_name(dtype)
    tpr, cta = tiling(dtype, d, variant)
    return KernelSpec(
        op=NAME,
        name=kernel_name(NAME, *variant_parts(short, variant), dims={"d": d}),
        template=TEMPLATE,
        params={"cuda_type": CUDA_TYPES[short], "d": d, "tpr": tpr, "cta": cta, "variant": int(variant[1:]),
                "min_blocks": 0},  # __launch_bounds__ min blocks per SM (0: none); 4 spills v2
        launch={"threads": cta, "rows_per_cta": cta // tpr},
        headers=("trace_kernels/quantize.cuh",),
    )


def quantize_dims(shape: ModelShape) -> list[int]:
    """Row lengths a layer quantizes: MoE input (H), down-GEMM input (I), KV heads (head_dim)."""
    return sorted({shape.hidden, shape.intermediate, shape.head_dim})


def specs_for_shape(shape: ModelShape) -> list[KernelSpec]:
    return [spec("bf16", d) for d in quantize_dims(shape)]


OP = OpCodegen(NAME, specs_for_shape, "x [rows, D] -> NVFP4 codes, scales, guidance bits, BF16 operand")
