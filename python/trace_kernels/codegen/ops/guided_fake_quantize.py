"""Codegen for `nvfp4_guided_fake_quantize`: one kernel per (dtype, D, guidance mode).

One variant, "v7" (the default since the H200 A/Bs of 2026-12-02): the trainer's call (compact guidance without
counters) launches v6's kernel (cuda/include/trace_kernels/guided_fake_quantize_v5.cuh: v4's software-pipelined loop
compiled for that call alone, the packed search's third level and output by prmt tables); every other mode has a
kernel of its own on the same loop and tables (guided_fake_quantize_v7.cuh), the counters' nearest parity on the FMA
pipe. v1..v5 lost to them on the H200 and were removed (docs/toolchain.md); `VARIANTS` keeps the selection the other
memory ops share.
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
SLOTS = 1  # whole blocks per thread and pass, plus the next pass's in flight (2 slots spill at 128 registers)
MODES = ("compact", "compact_counters", "full", "full_counters")  # guidance mode, "_counters" when counted
COMPACT_CTAS_PER_SM = 3  # v6 (the trainer's call): 77 registers at 3 CTAs of 256 threads without spills (4: spills)
# v7's kernels: (threads per CTA, __launch_bounds__' CTAs per SM) per mode, the most warps without spills (BF16:
# 94, 80 and 119 registers); FP16 input with full guidance spills at 3 x 256 for some D and takes 5 x 128.
# Full guidance with counters spilled with the tables at any occupancy until the counters' nearest-parity
# search moved to the FMA pipe (guided_count_pair); until then that call ran on v4's kernel.
# A third element: v3's loop (no software pipelining, fewer registers) with that many blocks per thread and pass;
# for compact guidance with counters (80 registers there) 6 x 128 x 1 or 2, 7 x 128 x 2 and 3 x 256 x 2 timed
# within 1-2% of v4's loop at 5 x 128 on the H200 (profiling/results/guided_plain_loop_h200.json).
V7_GEOMETRY = {"compact_counters": (128, 5), "full": (256, 3), "full_counters": (256, 2)}
V7_GEOMETRY_F16 = {"full": (128, 5)}  # FP16 input: these modes differ from V7_GEOMETRY
VARIANTS = ("v7",)
# the default launch: v7 (profiling/results/guided_v7_h200.json and guided_fma_h200.json, 64 / 256 MB): v6's
# kernel for the compact call (87-88% of copy), v7's for compact with counters (70-71%; v4 64-65%), full guidance
# without counters (90-92%; v4 80%) and full guidance with counters (63-65%; v4 60%)
VARIANT = "v7"


def check_variant(variant: str | None) -> str:
    return resolve_variant(NAME, VARIANTS, VARIANT, variant)  # VARIANT read at call time (tests patch it)


def mode_of(full: bool, counters: bool) -> str:
    """The MODES entry of a call: full or compact guidance, with or without counters."""
    return ("full" if full else "compact") + ("_counters" if counters else "")


def spec(dtype, d: int, variant: str | None = None, mode: str = "compact") -> KernelSpec:
    """The kernel of one call: v6's for the trainer's call (compact guidance without counters), v7's own kernel for
    each of the other three modes."""
    if mode not in MODES:
        raise ValueError(f"{NAME}: mode {mode!r} is not one of {MODES}")
    check_variant(variant)
    return _spec(dtype, d, mode)


# memoized: the ops build their spec on every launch
@functools.lru_cache(maxsize=None)
def _spec(dtype, d: int, mode: str) -> KernelSpec:
    if d <= 0 or d % 16:
        raise ValueError(f"{NAME}: D={d} must be a positive multiple of 16")
    short = dtype_name(dtype)
    # persistent: grid = one wave of what the occupancy query allows; a unit is a 16-element block
    if mode == MODES[0]:  # v6's kernel
        kernel, cta, per_sm, slots, loop, header = "v6", CTA, COMPACT_CTAS_PER_SM, SLOTS, {}, "_v5"
        name_parts = ("compact",)
        mode_params = {}
    else:
        kernel, header = "v7", "_v7"
        cta, per_sm, *plain_slots = (V7_GEOMETRY_F16 if short == "f16" else {}).get(mode, V7_GEOMETRY[mode])
        loop = {"pipelined": not plain_slots}
        slots = plain_slots[0] if plain_slots else SLOTS
        name_parts = (mode,)
        mode_params = {"mode": mode, "full": mode.startswith("full"), "count": mode.endswith("_counters")}
    return KernelSpec(
        op=NAME,
        name=kernel_name(NAME, *variant_parts(short, kernel), *name_parts, dims={"d": d}),
        template=TEMPLATE,
        params={"cuda_type": CUDA_TYPES[short], "d": d, "cta": cta, "variant": int(kernel[1:]), "slots": slots,
                "min_ctas_per_sm": per_sm, **loop, **mode_params},
        launch={"threads": cta, "elements_per_unit": 16, "units_per_cta": cta * slots},
        headers=(f"trace_kernels/guided_fake_quantize{header}.cuh",),
    )


def specs_for_shape(shape: ModelShape) -> list[KernelSpec]:
    """The kernels of every mode (the trainer's call: compact guidance without counters; the audits': the
    others), so an ahead-of-time build needs no JIT for any call."""
    specs = {s.name: s for d in quantize_dims(shape) for s in (spec("bf16", d, mode=m) for m in MODES)}
    return list(specs.values())  # by name: one kernel may serve several modes


OP = OpCodegen(NAME, specs_for_shape, "trainer x + rollout guidance -> guided fake-quantized x, audit counters")
