"""Codegen for `nvfp4_guided_fake_quantize`: one kernel per (dtype, D, variant); compact and full
guidance share it (the full variant is chosen at launch by passing rollout codes).

Variants (cuda/include/trace_kernels/guided_fake_quantize.cuh): "v1" grid position + index
arithmetic per element (measured on the H200, docs/toolchain.md), "v2" the chosen grid value from
FP32 bit patterns, range check per half block, "v3" no division: exact 16-bit thresholds per block
and a packed guided search, whole blocks per thread in a persistent grid-stride loop, counters
reduced per CTA, "v4" v3 software-pipelined: the next pass's loads are issued before the current
pass is computed (cuda/include/trace_kernels/guided_fake_quantize_v4.cuh). `VARIANT` is what the op
launches.
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
SLOTS = 4  # v1/v2: half blocks per thread: 64 B of 16-bit input in flight per thread
V3_SLOTS = 2  # v3: whole blocks per thread and pass: 64 B in flight per thread (2 CTAs of 256 per SM: no spills at 128 registers)
V3_CTAS_PER_SM = 2  # v3's persistent grid: SMs x this many CTAs (the occupancy __launch_bounds__ asks for)
V4_SLOTS = 1  # v4: one block per pass plus the next pass's in flight (2 slots spill at 128 registers)
V4_CTAS_PER_SM = 2  # as v3
VARIANTS = ("v1", "v2", "v3", "v4")
VARIANT = "v4"  # the default launch: fastest in every mode in the same-run A/B of 2026-11-29 (profiling/run_gpu_checks_memory_ab.sh), bit-exact


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
    if variant in ("v3", "v4"):  # grid = min(units / units_per_cta, SMs x ctas_per_sm); a unit is a 16-element block
        slots, per_sm = (V3_SLOTS, V3_CTAS_PER_SM) if variant == "v3" else (V4_SLOTS, V4_CTAS_PER_SM)
        geometry = {"params": {"slots": slots, "min_ctas_per_sm": per_sm},
                    "launch": {"elements_per_unit": 16, "units_per_cta": CTA * slots, "ctas_per_sm": per_sm}}
    else:  # one pass: a unit is a half block
        geometry = {"params": {"slots": SLOTS, "min_ctas_per_sm": 0},
                    "launch": {"elements_per_unit": 8, "units_per_cta": CTA * SLOTS}}
    return KernelSpec(
        op=NAME,
        name=kernel_name(NAME, *variant_parts(short, variant), dims={"d": d}),
        template=TEMPLATE,
        params={"cuda_type": CUDA_TYPES[short], "d": d, "cta": CTA, "variant": int(variant[1:]), **geometry["params"]},
        launch={"threads": CTA, **geometry["launch"]},
        headers=(f"trace_kernels/guided_fake_quantize{'_v4' if variant == 'v4' else ''}.cuh",),
    )


def specs_for_shape(shape: ModelShape) -> list[KernelSpec]:
    return [spec("bf16", d) for d in quantize_dims(shape)]


OP = OpCodegen(NAME, specs_for_shape, "trainer x + rollout guidance -> guided fake-quantized x, audit counters")
