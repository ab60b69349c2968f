"""Codegen for `moe_pack`: natural per-expert NVFP4 -> the MoE GEMM's packed, encoded weights
(cuda/include/trace_kernels/moe_pack.cuh). One kernel per row grouping: 1 (plain) or 2 (gate/up rows
interleaved by 8); every shape is a run-time argument.
"""

from __future__ import annotations

import functools

from trace_kernels.codegen.registry import OpCodegen
from trace_kernels.codegen.spec import KernelSpec, kernel_name
from trace_kernels.shapes import ModelShape

NAME = "moe_pack"
TEMPLATE = "moe_pack.cu.jinja"
THREADS = 256  # moe_pack::kThreads


@functools.lru_cache(maxsize=None)
def spec(groups: int) -> KernelSpec:
    if groups not in (1, 2):
        raise ValueError(f"moe_pack groups must be 1 or 2, got {groups}")
    return KernelSpec(op=NAME, name=kernel_name(NAME, "nvfp4", dims={"g": groups}), template=TEMPLATE,
                      params={"groups": groups}, launch={"threads": THREADS},
                      headers=("trace_kernels/moe_pack.cuh",))


def specs_for_shape(shape: ModelShape) -> list[KernelSpec]:
    return [spec(1), spec(2)]  # down (plain rows) and gate_up (interleaved)


OP = OpCodegen(NAME, specs_for_shape, "natural NVFP4 expert weights -> the MoE GEMM's packed, encoded layout")
