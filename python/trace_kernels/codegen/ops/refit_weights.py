"""Codegen for `nvfp4_refit_weights`: expert weights [E, N, K] -> per-expert NVFP4, in place.

The kernel walks each expert as a flat run of N*K elements (blocks along K never straddle rows
since K % 16 == 0), so one kernel per (dtype, variant) serves every expert shape; K only locates
bad values. Variants: "v2" two plain launches (amax pass, quantize pass; refit_weights.cuh), "v8" a
speculative refit: the first launch quantizes with the scale the buffers hold from the previous refit
as a guess while every warp stores its amax, the second (a programmatic dependent) requantizes the
experts whose scale changed, "v9" v8 with the verdicts in a launch of their own and one wave of CTAs
sharing out the failed experts' tiles (refit_weights_speculative.cuh). `VARIANT` is what the op
launches. v1, v3..v7, v10 and v11 lost to these on the H200 and were removed (docs/toolchain.md).
"""

from __future__ import annotations

import functools
import os

from trace_kernels.codegen.registry import OpCodegen
from trace_kernels.codegen.spec import CUDA_TYPES, KernelSpec, dtype_name, kernel_name, resolve_variant, variant_parts
from trace_kernels.shapes import ModelShape

NAME = "nvfp4_refit_weights"
TEMPLATE = "nvfp4_refit_weights.cu.jinja"
CTA = 256
VARIANTS = ("v2", "v8", "v9")
# The default launch: v9, speculative (docs/toolchain.md, "refit v8 and v9"): on an RL sync's usual input, weights after
# a small step with most experts' amax kept, 1.3-1.5x v2 from 64 MB up; v2 (two passes, no guess) is faster only when
# the buffers hold a valid but wrong scale for most experts (e.g. one buffer set reused for unrelated weights).
# TRACE_KERNELS_REFIT_VARIANT overrides it.
VARIANT = os.environ.get("TRACE_KERNELS_REFIT_VARIANT", "v9")
if VARIANT not in VARIANTS:
    raise ValueError(f"TRACE_KERNELS_REFIT_VARIANT={VARIANT!r}; known: {', '.join(VARIANTS)}")


def check_variant(variant: str | None) -> str:
    return resolve_variant(NAME, VARIANTS, VARIANT, variant)  # VARIANT read at call time (tests patch it)


def spec(dtype, variant: str | None = None) -> KernelSpec:
    return _spec(dtype, check_variant(variant))


# memoized: the ops build their spec on every launch; spec() resolves the variant first, since VARIANT may change
@functools.lru_cache(maxsize=None)
def _spec(dtype, variant: str) -> KernelSpec:
    short = dtype_name(dtype)
    slots = 2 if short == "f32" else 8  # FP32: 4 slots spill at 64 registers
    return KernelSpec(
        op=NAME,
        name=kernel_name(NAME, *variant_parts(short, variant)),
        template=TEMPLATE,
        params={"cuda_type": CUDA_TYPES[short], "cta": CTA, "slots": slots, "variant": int(variant[1:])},
        launch={"threads": CTA, "tile_half_blocks": CTA * slots, "variant": variant},
        headers=("trace_kernels/refit_weights_kernel.cuh",),
    )


def specs_for_shape(shape: ModelShape) -> list[KernelSpec]:
    return [spec("bf16")]


OP = OpCodegen(NAME, specs_for_shape, "expert weights [E, N, K] -> per-expert NVFP4 written in place")
