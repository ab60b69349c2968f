"""Codegen for `nvfp4_guided_fake_quantize`: one kernel per (dtype, D, variant); compact and full
guidance share it (the full variant is chosen at launch by passing rollout codes).

Variants (cuda/include/trace_kernels/guided_fake_quantize.cuh): "v1" grid position + index
arithmetic per element (measured on the H200, docs/toolchain.md), "v2" the chosen grid value from
FP32 bit patterns, range check per half block. `VARIANT` is what the op launches.
"""

from __future__ import annotations

import functools

from trace_kernels.codegen.ops.quantize import quantize_dims
from trace_kernels.codegen.registry import OpCodegen
from trace_kernels.codegen.spec import CUDA_TYPES, KernelSpec, dtype_name, kernel_name, resolve_variant, variant_parts
from trace_kernels.shapes import ModelShape

NAME = "nvfp4_guided_fake_quantize"
TEMPLATE = "nvfp4_guided_fake_quantize.cu.jinja"
CTA = 256
SLOTS = 4  # half blocks per thread: 64 B of 16-bit input in flight per thread
VARIANTS = ("v1", "v2")
VARIANT = "v2"  # the default launch: fastest in the same-run A/B of 2026-11-29 (profiling/run_gpu_checks_issue3.sh), bit-exact


def check_variant(variant: str | None) -> str:
    return resolve_variant(NAME, VARIANTS, VARIANT, variant)  # VARIANT read at call time (tests patch it)


def spec(dtype, d: int, variant: str | None = None) -> KernelSpec:
    return _spec(dtype, d, check_variant(variant))


# memoized: the ops build their spec on every launch; spec() resolves the variant first, since VARIANT may change
@functools.lru_cache(maxsize=None)
def _spec(dtype, d: int, variant: str) -> KernelSpec:
    if d <= 0 or d % 16:
        raise ValueError(f"{NAME}: D={d} must be a positive multiple of 16")
    short = dtype_name(dtype)
    return KernelSpec(
        op=NAME,
        name=kernel_name(NAME, *variant_parts(short, variant), dims={"d": d}),
        template=TEMPLATE,
        params={"cuda_type": CUDA_TYPES[short], "d": d, "cta": CTA, "slots": SLOTS, "variant": int(variant[1:])},
        launch={"threads": CTA, "half_blocks_per_cta": CTA * SLOTS},
        headers=("trace_kernels/guided_fake_quantize.cuh",),
    )


def specs_for_shape(shape: ModelShape) -> list[KernelSpec]:
    return [spec("bf16", d) for d in quantize_dims(shape)]


OP = OpCodegen(NAME, specs_for_shape, "trainer x + rollout guidance -> guided fake-quantized x, audit counters")
