"""Codegen for `nvfp4_guided_fake_quantize`: one kernel per (dtype, D, variant); compact and full
guidance share it (the full variant is chosen at launch by passing rollout codes).

Variants (cuda/include/trace_kernels/guided_fake_quantize.cuh): "v1" grid position + index
arithmetic per element (measured on the H200, docs/toolchain.md), "v2" the chosen grid value from
FP32 bit patterns, range check per half block, "v3" no division: exact 16-bit thresholds per block
and a packed guided search, whole blocks per thread in a persistent grid-stride loop, counters
reduced per CTA, "v4" v3 software-pipelined: the next pass's loads are issued before the current
pass is computed (cuda/include/trace_kernels/guided_fake_quantize_v4.cuh), "v5" v4 compiled for the
trainer's call alone (compact guidance, no counters: its own registers and occupancy; the other modes
launch v4's kernel), "v6" v5 with v3's third search level and output tree done by prmt table lookups
(cuda/include/trace_kernels/guided_fake_quantize_v5.cuh), "v7" v6's kernel for the trainer's call, a kernel
of its own for each other mode: v4's loop compiled for that mode with v6's tables, the counters' nearest
parity on the FMA pipe (cuda/include/trace_kernels/guided_fake_quantize_v7.cuh).
`VARIANT` is what the op launches.
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
MODES = ("compact", "compact_counters", "full", "full_counters")  # guidance mode, "_counters" when counted
# v5 / v6 build MODES[0] only (the trainer's call): on the H200 (2026-12-02) v4's loop compiled for one mode
# was faster only there (compact with counters slower, full guidance equal); other modes launch v4.
COMPACT_ONLY = ("v5", "v6")
COMPACT_ONLY_CTAS_PER_SM = 3  # v5 / v6: 77 registers at 3 CTAs of 256 threads without spills (4: spills)
# v7's kernels: (threads per CTA, __launch_bounds__' CTAs per SM) per mode, the most warps without spills (BF16:
# 94, 80 and 119 registers); FP16 input with full guidance spills at 3 x 256 for some D and takes 5 x 128.
# Full guidance with counters spilled with the tables at any occupancy until the counters' nearest-parity
# search moved to the FMA pipe (guided_count_pair); until then that call ran on v4's kernel.
# A third element: v3's loop (no software pipelining, fewer registers) with that many blocks per thread and pass;
# for compact guidance with counters (80 registers there) 6 x 128 x 1 or 2, 7 x 128 x 2 and 3 x 256 x 2 timed
# within 1-2% of v4's loop at 5 x 128 on the H200 (profiling/results/guided_plain_loop_h200.json).
V7_GEOMETRY = {"compact_counters": (128, 5), "full": (256, 3), "full_counters": (256, 2)}
V7_GEOMETRY_F16 = {"full": (128, 5)}  # FP16 input: these modes differ from V7_GEOMETRY
VARIANTS = ("v1", "v2", "v3", "v4", "v5", "v6", "v7")
HEADER_SUFFIX = {"v4": "_v4", "v5": "_v5", "v6": "_v5", "v7": "_v7"}  # v1..v3: guided_fake_quantize.cuh
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
    """The kernel of one call: v1..v4 serve every mode with one kernel; v5 / v6 have a kernel for compact
    guidance without counters and launch v4's for the other modes; v7 launches v6's for that call and has a
    kernel per mode for the other three."""
    if mode not in MODES:
        raise ValueError(f"{NAME}: mode {mode!r} is not one of {MODES}")
    variant = check_variant(variant)
    if variant == "v7" and mode == MODES[0]:
        variant = "v6"
    if variant in COMPACT_ONLY and mode != MODES[0]:
        variant = "v4"
    return _spec(dtype, d, variant, mode if variant == "v7" else None)


# memoized: the ops build their spec on every launch; spec() resolves the variant first, since VARIANT may change
@functools.lru_cache(maxsize=None)
def _spec(dtype, d: int, variant: str, mode: str | None) -> KernelSpec:
    if d <= 0 or d % 16:
        raise ValueError(f"{NAME}: D={d} must be a positive multiple of 16")
    short = dtype_name(dtype)
    # persistent variants: grid = min(units / units_per_cta, SMs x ctas_per_sm); a unit is a 16-element block
    cta = CTA
    if variant not in ("v1", "v2"):
        slots, per_sm = {"v3": (V3_SLOTS, V3_CTAS_PER_SM), "v4": (V4_SLOTS, V4_CTAS_PER_SM)}.get(
            variant, (V4_SLOTS, COMPACT_ONLY_CTAS_PER_SM))
        loop = {}
        if variant == "v7":
            cta, per_sm, *plain_slots = (V7_GEOMETRY_F16 if short == "f16" else {}).get(mode, V7_GEOMETRY[mode])
            loop = {"pipelined": not plain_slots}
            slots = plain_slots[0] if plain_slots else slots
        geometry = {"params": {"slots": slots, "min_ctas_per_sm": per_sm, **loop},
                    "launch": {"elements_per_unit": 16, "units_per_cta": cta * slots, "ctas_per_sm": per_sm,
                               "fill_sms": variant in (*COMPACT_ONLY, "v7")}}  # the grid: the occupancy query's wave
    else:  # one pass: a unit is a half block
        geometry = {"params": {"slots": SLOTS, "min_ctas_per_sm": 0},
                    "launch": {"elements_per_unit": 8, "units_per_cta": CTA * SLOTS}}
    return KernelSpec(
        op=NAME,
        name=kernel_name(NAME, *variant_parts(short, variant), *(MODES[:1] if variant in COMPACT_ONLY else ()),
                         *((mode,) if mode else ()), dims={"d": d}),
        template=TEMPLATE,
        params={"cuda_type": CUDA_TYPES[short], "d": d, "cta": cta, "variant": int(variant[1:]), **geometry["params"],
                **({"mode": mode, "full": mode.startswith("full"), "count": mode.endswith("_counters")} if mode else {})},
        launch={"threads": cta, **geometry["launch"]},
        headers=(f"trace_kernels/guided_fake_quantize{HEADER_SUFFIX.get(variant, '')}.cuh",),
    )


def specs_for_shape(shape: ModelShape) -> list[KernelSpec]:
    """The kernels of every mode (the trainer's call: compact guidance without counters; the audits': the
    others), so an ahead-of-time build needs no JIT for any call."""
    specs = {s.name: s for d in quantize_dims(shape) for s in (spec("bf16", d, mode=m) for m in MODES)}
    return list(specs.values())  # by name: one kernel may serve several modes


OP = OpCodegen(NAME, specs_for_shape, "trainer x + rollout guidance -> guided fake-quantized x, audit counters")
