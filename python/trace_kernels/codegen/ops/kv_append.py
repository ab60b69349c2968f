"""Codegen for `kv_append`: K/V rows -> paged cache (NVFP4 with optional guidance, or BF16).

One kernel per (cache format, kv heads, head_dim); the page size does not enter (slots are flat).
"""

from __future__ import annotations

from trace_kernels.codegen.registry import OpCodegen
from trace_kernels.codegen.spec import KernelSpec, kernel_name
from trace_kernels.shapes import ModelShape

NAME = "kv_append"
TEMPLATE = "kv_append.cu.jinja"
CTA = 256
FORMATS = ("nvfp4", "bf16")


def spec(cache_format: str, kv_heads: int, head_dim: int) -> KernelSpec:
    if cache_format not in FORMATS:
        raise ValueError(f"{NAME}: cache format must be one of {FORMATS}, got {cache_format!r}")
    if kv_heads <= 0:
        raise ValueError(f"{NAME}: kv_heads must be positive, got {kv_heads}")
    nvfp4 = cache_format == "nvfp4"
    threads_per_row = head_dim // 16 if nvfp4 else head_dim // 8
    if head_dim <= 0 or head_dim % 16 or threads_per_row > 32 or threads_per_row & (threads_per_row - 1):
        raise ValueError(f"{NAME}: head_dim {head_dim} must be 16 times a power of two, at most 512 (NVFP4) / 256 (BF16)")
    return KernelSpec(
        op=NAME,
        name=kernel_name(NAME, cache_format, dims={"hkv": kv_heads, "d": head_dim}),
        template=TEMPLATE,
        params={"nvfp4": nvfp4, "d": head_dim, "hkv": kv_heads, "cta": CTA},
        launch={"threads": CTA, "rows_per_cta": CTA // threads_per_row},
        headers=("trace_kernels/kv_append.cuh",),
    )


def specs_for_shape(shape: ModelShape) -> list[KernelSpec]:
    return [spec(f, shape.kv_heads, shape.head_dim) for f in FORMATS]


OP = OpCodegen(NAME, specs_for_shape, "K/V [T, Hkv, D] + slot mapping -> NVFP4 (+ guidance) or BF16 KV pages")
