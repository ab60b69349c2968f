"""Codegen for `nvfp4_quantize`: row quantization of x [rows, D], one kernel per (dtype, D)."""

from __future__ import annotations

from trace_kernels.codegen.registry import OpCodegen
from trace_kernels.codegen.spec import CUDA_TYPES, KernelSpec, dtype_name, kernel_name
from trace_kernels.shapes import ModelShape

NAME = "nvfp4_quantize"
TEMPLATE = "nvfp4_quantize.cu.jinja"
MIN_CTA = 256


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def tiling(dtype, d: int) -> tuple[int, int]:
    """(threads per row, threads per block) for rows of d elements.

    Each thread keeps ~4 half blocks (64 B of 16-bit input, 128 B of FP32) in registers: few
    registers, so many warps per SM overlap one row group's loads with another's arithmetic.
    """
    half_blocks = d // 8
    per_thread = 4
    tpr = min(1024, max(2, _pow2_ceil(-(-half_blocks // per_thread))))
    return tpr, max(tpr, MIN_CTA)


def spec(dtype, d: int) -> KernelSpec:
    if d <= 0 or d % 16:
        raise ValueError(f"{NAME}: D={d} must be a positive multiple of 16")
    short = dtype_name(dtype)
    tpr, cta = tiling(dtype, d)
    return KernelSpec(
        op=NAME,
        name=kernel_name(NAME, short, dims={"d": d}),
        template=TEMPLATE,
        params={"cuda_type": CUDA_TYPES[short], "d": d, "tpr": tpr, "cta": cta},
        launch={"threads": cta, "rows_per_cta": cta // tpr},
        headers=("trace_kernels/quantize.cuh",),
    )


def quantize_dims(shape: ModelShape) -> list[int]:
    """Row lengths a layer quantizes: MoE input (H), down-GEMM input (I), KV heads (head_dim)."""
    return sorted({shape.hidden, shape.intermediate, shape.head_dim})


def specs_for_shape(shape: ModelShape) -> list[KernelSpec]:
    return [spec("bf16", d) for d in quantize_dims(shape)]


OP = OpCodegen(NAME, specs_for_shape, "x [rows, D] -> NVFP4 codes, scales, guidance bits, BF16 operand")
