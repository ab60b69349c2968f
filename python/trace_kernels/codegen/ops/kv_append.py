"""Codegen for `kv_append`: K/V rows -> paged cache (NVFP4 with optional guidance, or BF16).

One kernel per (cache format, kv heads, head_dim); the page size does not enter (slots are flat).
"""

from __future__ import annotations

import functools
import re

from trace_kernels.codegen.registry import OpCodegen, UnsupportedShape
from trace_kernels.codegen.spec import KernelSpec, kernel_name
from trace_kernels.shapes import ModelShape

NAME = "kv_append"
TEMPLATE = "kv_append.cu.jinja"
CTA = 256
FORMATS = ("nvfp4", "bf16")
# NVFP4 16-element blocks per thread: "b1", "b2" (twice the loads in flight per thread; the default,
# kv_append.DEFAULT_NVFP4_VARIANT, is b2 in 128-thread CTAs) or "b4" (row-level work once per four
# blocks; slower on the H200)
VARIANTS = {"b1": 1, "b2": 2, "b4": 4}
# An NVFP4 variant may also name its CTA size, "b2_cta128" (threads per CTA; default CTA), and the
# CTAs per SM its registers must allow, "b2_cta128_mb12" (__launch_bounds__' second argument).
VARIANT = re.compile(r"^(b[124])(?:_cta(64|128|256|512))?(?:_mb([1-9]|1[0-6]))?$")


@functools.lru_cache(maxsize=None)  # memoized: built on every launch
def spec(cache_format: str, kv_heads: int, head_dim: int, variant: str = "b1") -> KernelSpec:
    if cache_format not in FORMATS:
        raise ValueError(f"{NAME}: cache format must be one of {FORMATS}, got {cache_format!r}")
    match = VARIANT.match(variant)
    if match is None:
        raise ValueError(f"{NAME}: variant must be one of {tuple(VARIANTS)}, optionally with _cta64/128/256/512 and/or _mb1..16, "
                         f"got {variant!r}")
    if variant != "b1" and cache_format != "nvfp4":
        raise ValueError(f"{NAME}: variant {variant!r} applies to NVFP4 pages only")
    blocks_per_thread = VARIANTS[match.group(1)]
    cta = int(match.group(2) or CTA)
    min_ctas_per_sm = int(match.group(3) or 0)
    if cta * min_ctas_per_sm > 2048:
        raise ValueError(f"{NAME}: variant {variant!r} asks for {min_ctas_per_sm} CTAs of {cta} threads per SM (at most 2048)")
    if kv_heads <= 0:
        raise ValueError(f"{NAME}: kv_heads must be positive, got {kv_heads}")
    nvfp4 = cache_format == "nvfp4"
    threads_per_row = head_dim // 16 if nvfp4 else head_dim // 8
    if head_dim <= 0 or head_dim % 16 or threads_per_row > 32 or threads_per_row & (threads_per_row - 1):
        raise UnsupportedShape(f"{NAME}: head_dim {head_dim} must be 16 times a power of two, at most 512 (NVFP4) / "
                               f"256 (BF16)")  # (a ValueError: generate / build leave the op out with this reason)
    if threads_per_row % blocks_per_thread:
        raise ValueError(f"{NAME}: head_dim {head_dim} has fewer than {blocks_per_thread} blocks per row")
    threads_per_row //= blocks_per_thread
    parts = (cache_format,) if variant == "b1" else (cache_format, variant)
    return KernelSpec(
        op=NAME,
        name=kernel_name(NAME, *parts, dims={"hkv": kv_heads, "d": head_dim}),
        template=TEMPLATE,
        params={"nvfp4": nvfp4, "d": head_dim, "hkv": kv_heads, "cta": cta, "blocks_per_thread": blocks_per_thread,
                "min_ctas_per_sm": min_ctas_per_sm},
        launch={"threads": cta, "rows_per_cta": cta // threads_per_row},
        headers=("trace_kernels/kv_append.cuh",),
    )


def specs_for_shape(shape: ModelShape) -> list[KernelSpec]:
    from trace_kernels.kv_append import default_nvfp4_variant  # what an append launches by default
    return [spec(f, shape.kv_heads, shape.head_dim) for f in FORMATS] + [
        spec("nvfp4", shape.kv_heads, shape.head_dim, default_nvfp4_variant(shape.head_dim))]


OP = OpCodegen(NAME, specs_for_shape, "K/V [T, Hkv, D] + slot mapping -> NVFP4 (+ guidance) or BF16 KV pages")
