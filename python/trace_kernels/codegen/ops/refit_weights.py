"""Codegen for `nvfp4_refit_weights`: expert weights [E, N, K] -> per-expert NVFP4, in place.

The kernel walks each expert as a flat run of N*K elements (blocks along K never straddle rows
since K % 16 == 0), so one kernel per dtype serves every expert shape; K only locates bad values.
"""

from __future__ import annotations

from trace_kernels.codegen.registry import OpCodegen
from trace_kernels.codegen.spec import CUDA_TYPES, KernelSpec, dtype_name, kernel_name
from trace_kernels.shapes import ModelShape

NAME = "nvfp4_refit_weights"
TEMPLATE = "nvfp4_refit_weights.cu.jinja"
CTA = 256


def spec(dtype) -> KernelSpec:
    short = dtype_name(dtype)
    slots = 2 if dtype_name(dtype) == "f32" else 8  # FP32: 4 slots spill at 64 registers
    return KernelSpec(
        op=NAME,
        name=kernel_name(NAME, short),
        template=TEMPLATE,
        params={"cuda_type": CUDA_TYPES[short], "cta": CTA, "slots": slots},
        launch={"threads": CTA, "tile_half_blocks": CTA * slots},
        headers=("trace_kernels/refit_weights.cuh",),
    )


def specs_for_shape(shape: ModelShape) -> list[KernelSpec]:
    return [spec("bf16")]


OP = OpCodegen(NAME, specs_for_shape, "expert weights [E, N, K] -> per-expert NVFP4 written in place")
