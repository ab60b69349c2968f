"""Codegen for `nvfp4_quantize`: row quantization of x [rows, D], one kernel per (dtype, D).

One variant, "v2" (cuda/include/trace_kernels/quantize.cuh): whole blocks per thread, per-block work once per 16
elements. "v1" (half blocks per thread) and "v4" (v2's arithmetic fed by per-warp rings of bulk copies) lost to it on
the H200 and were removed (docs/toolchain.md); `VARIANTS` keeps the selection the other memory ops share.
"""

from __future__ import annotations

import functools

from trace_kernels.codegen.registry import OpCodegen
from trace_kernels.codegen.spec import CUDA_TYPES, KernelSpec, dtype_name, kernel_name, resolve_variant, variant_parts
from trace_kernels.shapes import ModelShape

NAME = "nvfp4_quantize"
TEMPLATE = "nvfp4_quantize.cu.jinja"
MIN_CTA = 128  # threads per block unless a row takes more: 83.5% vs 80% of copy at 64 MB (256), the
# shorter last wave (profiling/results/memory_quantize_cta_h200.json); names carry any other value
VARIANTS = ("v2",)
VARIANT = "v2"  # the default launch: fastest in the same-run A/Bs on the H200 (profiling/device/run_gpu_checks_issue3.sh), bit-exact


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def check_variant(variant: str | None) -> str:
    return resolve_variant(NAME, VARIANTS, VARIANT, variant)  # VARIANT read at call time (tests patch it)


DEFAULT_MIN_CTA = MIN_CTA  # the block size kernel names leave out


def tiling(dtype, d: int, min_cta: int = MIN_CTA) -> tuple[int, int]:
    """(threads per row, threads per block) for rows of d elements: ~4 whole blocks (128 B; 2 for FP32) per thread,
    so a 2048-wide BF16 row is one warp (no shared-memory reduction)."""
    per_thread = 2 if dtype_name(dtype) == "f32" else 4  # FP32: 128 B, as 16-bit
    tpr = min(1024, _pow2_ceil(-(-(d // 16) // per_thread)))
    return tpr, max(tpr, min_cta)


def spec(dtype, d: int, variant: str | None = None) -> KernelSpec:
    """The kernel for rows of d elements."""
    return _spec(dtype, d, check_variant(variant), MIN_CTA)  # MIN_CTA read at call time (the benchmark sweeps it)


# memoized: the ops build their spec on every launch
@functools.lru_cache(maxsize=None)
def _spec(dtype, d: int, variant: str, min_cta: int) -> KernelSpec:
    if d <= 0 or d % 16:
        raise ValueError(f"{NAME}: D={d} must be a positive multiple of 16")
    short = dtype_name(dtype)
    tpr, cta = tiling(dtype, d, min_cta)
    return KernelSpec(
        op=NAME,
        name=kernel_name(NAME, *variant_parts(short, variant),
                         dims={"d": d, **({"cta": cta} if cta != tiling(dtype, d, DEFAULT_MIN_CTA)[1] else {})}),
        template=TEMPLATE,
        params={"cuda_type": CUDA_TYPES[short], "d": d, "tpr": tpr, "cta": cta, "variant": int(variant[1:])},
        launch={"threads": cta, "rows_per_cta": cta // tpr},
        headers=("trace_kernels/quantize.cuh",),
    )


def quantize_dims(shape: ModelShape) -> list[int]:
    """Row lengths a layer quantizes: MoE input (H), down-GEMM input (I), KV heads (head_dim)."""
    return sorted({shape.hidden, shape.intermediate, shape.head_dim})


def specs_for_shape(shape: ModelShape) -> list[KernelSpec]:
    return [spec("bf16", d) for d in quantize_dims(shape)]


OP = OpCodegen(NAME, specs_for_shape, "x [rows, D] -> NVFP4 codes, scales, guidance bits, BF16 operand")
