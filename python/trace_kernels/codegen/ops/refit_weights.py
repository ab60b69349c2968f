"""Codegen for `nvfp4_refit_weights`: expert weights [E, N, K] -> per-expert NVFP4, in place.

The kernel walks each expert as a flat run of N*K elements (blocks along K never straddle rows
since K % 16 == 0), so one kernel per (dtype, variant) serves every expert shape; K only locates
bad values. Variants (cuda/include/trace_kernels/refit_weights.cuh): "v1" one cooperative launch
with per-expert group barriers (measured on the H200, docs/toolchain.md), "v2" two plain launches
(amax pass, quantize pass), "v3" one cooperative launch pipelining chunks of experts two deep,
"v4" one cooperative launch whose tiles wait for their expert's amax in shared memory (bulk copies),
"v5" one ordinary launch taking amax and quantize tiles from a work queue that overlaps the amax
stream of one chunk of experts with the quantize of the previous one, "v6" one cooperative launch of
one CTA per SM (`V6_THREADS` threads) in which every warp pipelines its own slice of each expert
through a shared-memory ring (bulk copies), publishing its amax through the CTA and quantizing once
every CTA has published, "v7" v2's two launches made speculative: the first quantizes with the
scale the buffers hold from the previous refit while it takes the amax, the second requantizes only
the experts whose scale changed, "v8" v7 with the guess checked per warp (no CTA barrier, no atomics,
no zeroed workspace) and the second launch a programmatic dependent of the first, "v9" v8 with the
verdicts in a launch of their own and one wave of CTAs sharing out the failed experts' tiles, "v10" v9's
work in one persistent launch: tiles claimed from a counter, each expert's verdict given by the CTA
that finished its last tile, then the failed experts' tiles claimed from the same grid (its kernel
takes a second workspace, counters that every launch leaves zeroed), "v11" v8's two launches with v9's
shared-out requantize wave, the verdicts read from per-expert marks that phase 0's warps store with
a device-side epoch (a second workspace too). `VARIANT` is what the op launches.
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
VARIANTS = ("v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10", "v11")
# v6's threads per CTA (one CTA per SM: its rings take the shared memory), read at call time like VARIANT. Fewer warps
# give each warp a larger slice of every expert, so its per-expert work (amax publish, ready check, scale) is spread
# over more blocks. 384 and 512 were the fastest from 64 MB to 1 GB on the H200, 4-5 points of copy ahead of the first
# build's 768 (docs/toolchain.md, "refit v6"). 768 keeps that build's kernel name; others add "t<threads>".
V6_THREADS = 384
V6_THREAD_CHOICES = (256, 384, 512, 768)
# The default launch: v9, speculative (docs/toolchain.md, "refit v8 and v9"): on an RL sync's usual input, weights after
# a small step with most experts' amax kept, 1.3-1.5x v2 from 64 MB up; v2 (two passes, no guess) is faster only when
# the buffers hold a valid but wrong scale for most experts (e.g. one buffer set reused for unrelated weights).
# TRACE_KERNELS_REFIT_VARIANT overrides it.
VARIANT = os.environ.get("TRACE_KERNELS_REFIT_VARIANT", "v9")
if VARIANT not in VARIANTS:
    raise ValueError(f"TRACE_KERNELS_REFIT_VARIANT={VARIANT!r}; known: {', '.join(VARIANTS)}")


def check_variant(variant: str | None) -> str:
    return resolve_variant(NAME, VARIANTS, VARIANT, variant)  # VARIANT read at call time (tests patch it)


def spec(dtype, variant: str | None = None, threads: int | None = None) -> KernelSpec:
    """threads: v6's threads per CTA (default V6_THREADS); the other variants have CTA."""
    variant = check_variant(variant)
    return _spec(dtype, variant, threads or (V6_THREADS if variant == "v6" else CTA))


# memoized: the ops build their spec on every launch; spec() resolves the variant first, since VARIANT may change
@functools.lru_cache(maxsize=None)
def _spec(dtype, variant: str, cta: int) -> KernelSpec:
    if cta not in ((CTA,) if variant != "v6" else V6_THREAD_CHOICES):
        raise ValueError(f"refit_weights {variant}: {cta} threads per CTA is not one of "
                         f"{V6_THREAD_CHOICES if variant == 'v6' else (CTA,)}")
    short = dtype_name(dtype)
    slots = 2 if short == "f32" else 8  # FP32: 4 slots spill at 64 registers
    if variant == "v4":
        slots = 2 if short == "f32" else 4  # 16 KB shared-memory tiles: 2 (FP32: 1) blocks per thread
    threads_part = (f"t{cta}",) if variant == "v6" and cta != 768 else ()
    return KernelSpec(
        op=NAME,
        name=kernel_name(NAME, *variant_parts(short, variant), *threads_part),
        template=TEMPLATE,
        # v6: one CTA per SM, so ptxas may use 85 registers at 768 threads, 168 at 384 (without the bound it capped
        # itself at 64 and spilled)
        params={"cuda_type": CUDA_TYPES[short], "cta": cta, "slots": slots, "variant": int(variant[1:]),
                "min_blocks": 1 if variant == "v6" else 0},
        launch={"threads": cta, "tile_half_blocks": cta * slots, "variant": variant},
        headers=("trace_kernels/refit_weights_kernel.cuh",),
    )


def specs_for_shape(shape: ModelShape) -> list[KernelSpec]:
    return [spec("bf16")]


OP = OpCodegen(NAME, specs_for_shape, "expert weights [E, N, K] -> per-expert NVFP4 written in place")
