"""Codegen for `decode_attention`: split-KV paged decode over NVFP4 or BF16 pages, plus the combine.

One kernel per (cache format, q heads, kv heads, head_dim, page size), e.g.
decode_attention_nvfp4_hq32_hkv4_d128_p16_sm90a; the combine kernel depends on head_dim only.
"""

from __future__ import annotations

import functools

from trace_kernels.codegen.registry import OpCodegen
from trace_kernels.codegen.spec import KernelSpec, kernel_name
from trace_kernels.shapes import ModelShape

NAME = "decode_attention"
COMBINE_NAME = "decode_attention_combine"
TEMPLATE = "decode_attention.cu.jinja"
MMA_TEMPLATE = "decode_attention_mma.cu.jinja"
MMA2_TEMPLATE = "decode_attention_mma2.cu.jinja"
COMBINE_TEMPLATE = "decode_attention_combine.cu.jinja"
FORMATS = ("nvfp4", "bf16")
HEAD_DIMS = (64, 128)  # shared-memory budget of the tile pipeline (attention_decode.cuh)
PAGE_SIZES = (16,)  # AOT set; any positive page size renders
THREADS = 128
MAX_HEADS_PER_CTA = 8  # FP32 q and accumulator registers: 2 * 8 * 8 per thread
MMA_MAX_HEADS_PER_CTA = 16  # the M rows of one m16n8k16 MMA
MMA2_MAX_HEADS_PER_CTA = 8  # the N columns of one m16n8k16 MMA (tokens are the M rows)
MMA2_WARPS, MMA2_STAGES = 2, 3  # 64-token tiles (32 per warp), 2 in flight; 29 KB, 7 CTAs per SM at D = 128
# "simt": FP32 CUDA-core math (attention_decode.cuh); "mma": tensor cores, q heads as MMA rows
# (attention_decode_mma.cuh); "mma2": NVFP4 only, tokens as MMA rows (attention_decode_mma2.cuh)
VARIANTS = ("simt", "mma", "mma2")
NVFP4_ONLY_VARIANTS = ("mma2",)
# cache format -> (tokens per tile, pipeline stages): ~9.5 KB (NVFP4) / 16 KB (BF16) per stage at D=128
TILING = {"nvfp4": (64, 3), "bf16": (32, 2)}


def tiling(cache_format: str, q_heads: int, kv_heads: int, head_dim: int, page_size: int,
           variant: str = "simt") -> dict:
    if variant not in VARIANTS:
        raise ValueError(f"{NAME}: variant must be one of {VARIANTS}, got {variant!r}")
    if cache_format not in FORMATS:
        raise ValueError(f"{NAME}: cache format must be one of {FORMATS}, got {cache_format!r}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"{NAME}: head_dim {head_dim} is not supported (supported: {HEAD_DIMS})")
    if kv_heads <= 0 or q_heads <= 0 or q_heads % kv_heads:
        raise ValueError(f"{NAME}: q_heads {q_heads} must be a positive multiple of kv_heads {kv_heads}")
    group = q_heads // kv_heads
    if group & (group - 1):
        raise ValueError(f"{NAME}: the GQA group q_heads / kv_heads = {group} must be a power of two")
    if page_size <= 0:
        raise ValueError(f"{NAME}: page size must be positive, got {page_size}")
    if variant in NVFP4_ONLY_VARIANTS and cache_format != "nvfp4":
        raise ValueError(f"{NAME}: variant {variant!r} reads NVFP4 pages only, got cache format {cache_format!r}")
    if variant == "mma2":
        heads_per_cta = min(group, MMA2_MAX_HEADS_PER_CTA)
        tile_tokens, stages = 32 * MMA2_WARPS, MMA2_STAGES
    elif variant == "mma":
        heads_per_cta = min(group, MMA_MAX_HEADS_PER_CTA)
        tile_tokens, stages = (64, 3) if cache_format == "nvfp4" else (32, 3)  # 4 / 2 warps of 16 tokens
    else:
        heads_per_cta = min(group, MAX_HEADS_PER_CTA, head_dim // 8)
        tile_tokens, stages = TILING[cache_format]
    return {"group": group, "heads_per_cta": heads_per_cta, "head_groups": group // heads_per_cta,
            "tile_tokens": tile_tokens, "stages": stages}


@functools.lru_cache(maxsize=None)  # memoized: built on every launch
def spec(cache_format: str, q_heads: int, kv_heads: int, head_dim: int, page_size: int,
         variant: str = "simt") -> KernelSpec:
    t = tiling(cache_format, q_heads, kv_heads, head_dim, page_size, variant)
    parts = (cache_format,) if variant == "simt" else (cache_format, variant)
    if variant == "mma2":
        return KernelSpec(
            op=NAME,
            name=kernel_name(NAME, *parts, dims={"hq": q_heads, "hkv": kv_heads, "d": head_dim, "p": page_size}),
            template=MMA2_TEMPLATE,
            params={"d": head_dim, "hkv": kv_heads, "group": t["group"], "heads_per_cta": t["heads_per_cta"],
                    "page": page_size, "warps": MMA2_WARPS, "stages": t["stages"]},
            launch={"threads": 32 * MMA2_WARPS, **t},
            headers=("trace_kernels/attention_decode.cuh", "trace_kernels/attention_decode_mma.cuh",
                     "trace_kernels/attention_decode_mma2.cuh"),
        )
    return KernelSpec(
        op=NAME,
        name=kernel_name(NAME, *parts, dims={"hq": q_heads, "hkv": kv_heads, "d": head_dim, "p": page_size}),
        template=TEMPLATE if variant == "simt" else MMA_TEMPLATE,
        params={"nvfp4": cache_format == "nvfp4", "d": head_dim, "hkv": kv_heads, "group": t["group"],
                "heads_per_cta": t["heads_per_cta"], "page": page_size, "tile_tokens": t["tile_tokens"],
                "stages": t["stages"]},
        launch={"threads": THREADS if variant == "simt" or cache_format == "nvfp4" else 64, **t},
        headers=("trace_kernels/attention_decode.cuh",) if variant == "simt" else (
            "trace_kernels/attention_decode.cuh", "trace_kernels/attention_decode_mma.cuh"),
    )


@functools.lru_cache(maxsize=None)  # memoized: built on every launch
def combine_spec(head_dim: int) -> KernelSpec:
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"{COMBINE_NAME}: head_dim {head_dim} is not supported (supported: {HEAD_DIMS})")
    return KernelSpec(op=NAME, name=kernel_name(COMBINE_NAME, dims={"d": head_dim}), template=COMBINE_TEMPLATE,
                      params={"d": head_dim}, launch={"threads": head_dim},
                      headers=("trace_kernels/attention_decode.cuh",))


def specs_for_shape(shape: ModelShape) -> list[KernelSpec]:
    if shape.head_dim not in HEAD_DIMS:
        return []
    specs = [spec(f, shape.q_heads, shape.kv_heads, shape.head_dim, p) for f in FORMATS for p in PAGE_SIZES]
    specs += [spec(f, shape.q_heads, shape.kv_heads, shape.head_dim, p, "mma") for f in FORMATS for p in PAGE_SIZES]
    specs += [spec("nvfp4", shape.q_heads, shape.kv_heads, shape.head_dim, p, "mma2") for p in PAGE_SIZES]
    return specs + [combine_spec(shape.head_dim)]


OP = OpCodegen(NAME, specs_for_shape, "paged split-KV decode attention (NVFP4 / BF16 pages) + split combine")
