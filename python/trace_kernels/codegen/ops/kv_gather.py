"""Codegen for `kv_gather`: paged NVFP4 K/V -> contiguous dequantized K and V (prefill / extend attention).

One kernel per (output dtype, kv heads, head_dim), e.g. kv_gather_nvfp4_bf16_hkv4_d128_sm90a; the page
size and the batch are launch arguments.
"""

from __future__ import annotations

import functools

from trace_kernels.codegen.registry import OpCodegen
from trace_kernels.codegen.spec import CUDA_TYPES, KernelSpec, dtype_name, kernel_name
from trace_kernels.shapes import ModelShape

NAME = "kv_gather"
TEMPLATE = "kv_gather.cu.jinja"
CTA = 256
# 16-element blocks per thread, all loaded before any is stored (names carry the ones other than ITEMS). One:
# in two same-run rounds on the H200 (profiling/results/kv_gather_h200.json) 82-86% of copy at 8-32 x 32K against
# 74-76% for two and 72-75% for four (more CTAs in flight beat more loads per thread).
ITEMS = 1
ITEM_CHOICES = (1, 2, 4)
OUT_DTYPES = ("bf16", "f16", "f32")


def check_items(items: int) -> int:
    if items not in ITEM_CHOICES:
        raise ValueError(f"{NAME}: items (blocks per thread) must be one of {ITEM_CHOICES}, got {items}")
    return items


@functools.lru_cache(maxsize=None)  # memoized: built on every launch
def spec(out_dtype, kv_heads: int, head_dim: int, items: int = ITEMS) -> KernelSpec:
    out = dtype_name(out_dtype)
    check_items(items)
    if kv_heads <= 0:
        raise ValueError(f"{NAME}: kv_heads must be positive, got {kv_heads}")
    if head_dim <= 0 or head_dim % 16:
        raise ValueError(f"{NAME}: head_dim must be a positive multiple of 16, got {head_dim}")
    return KernelSpec(
        op=NAME,
        name=kernel_name(NAME, "nvfp4", out, *(() if items == ITEMS else (f"i{items}",)),
                         dims={"hkv": kv_heads, "d": head_dim}),
        template=TEMPLATE,
        params={"d": head_dim, "hkv": kv_heads, "cta": CTA, "items": items, "out_type": CUDA_TYPES[out]},
        launch={"threads": CTA, "blocks_per_cta": CTA * items},
        headers=("trace_kernels/kv_gather.cuh",),
    )


def specs_for_shape(shape: ModelShape) -> list[KernelSpec]:
    return [spec("bf16", shape.kv_heads, shape.head_dim)]  # the model dtype of prefill attention


OP = OpCodegen(NAME, specs_for_shape, "paged NVFP4 K/V -> contiguous dequantized K and V [B, S, Hkv, D]")
