"""Codegen for `nvfp4_guided_fake_quantize`: one kernel per (dtype, D); compact and full guidance
share it (the full variant is chosen at launch by passing rollout codes)."""

from __future__ import annotations

from trace_kernels.codegen.ops.quantize import quantize_dims
from trace_kernels.codegen.registry import OpCodegen
from trace_kernels.codegen.spec import CUDA_TYPES, KernelSpec, dtype_name, kernel_name
from trace_kernels.shapes import ModelShape

NAME = "nvfp4_guided_fake_quantize"
TEMPLATE = "nvfp4_guided_fake_quantize.cu.jinja"
CTA = 256
SLOTS = 4  # half blocks per thread: 64 B of 16-bit input in flight per thread


def spec(dtype, d: int) -> KernelSpec:
    if d <= 0 or d % 16:
        raise ValueError(f"{NAME}: D={d} must be a positive multiple of 16")
    short = dtype_name(dtype)
    return KernelSpec(
        op=NAME,
        name=kernel_name(NAME, short, dims={"d": d}),
        template=TEMPLATE,
        params={"cuda_type": CUDA_TYPES[short], "d": d, "cta": CTA, "slots": SLOTS},
        launch={"threads": CTA, "half_blocks_per_cta": CTA * SLOTS},
        headers=("trace_kernels/guided_fake_quantize.cuh",),
    )


def specs_for_shape(shape: ModelShape) -> list[KernelSpec]:
    return [spec("bf16", d) for d in quantize_dims(shape)]


OP = OpCodegen(NAME, specs_for_shape, "trainer x + rollout guidance -> guided fake-quantized x, audit counters")
