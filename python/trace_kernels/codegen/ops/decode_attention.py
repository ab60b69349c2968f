"""Codegen for `decode_attention`: split-KV paged decode over NVFP4 or BF16 pages, plus the combine.

One kernel per (cache format, q heads, kv heads, head_dim, page size), e.g.
decode_attention_nvfp4_hq32_hkv4_d128_p16_sm90a; the combine kernel depends on head_dim only.
"""

from __future__ import annotations

import functools
import re

from trace_kernels.codegen.registry import OpCodegen, UnsupportedShape
from trace_kernels.codegen.spec import KernelSpec, kernel_name
from trace_kernels.shapes import ModelShape

NAME = "decode_attention"
COMBINE_NAME = "decode_attention_combine"
COMBINE_THREADS = 256  # 8 warps = kCombineWarps (attention_split_combine.cuh), each a few whole split rows in flight
TEMPLATE = "decode_attention.cu.jinja"
MMA_TEMPLATE = "decode_attention_mma.cu.jinja"
MMA2_TEMPLATE = "decode_attention_mma2.cu.jinja"
MMA3_TEMPLATE = "decode_attention_mma3.cu.jinja"
MMA4_TEMPLATE = "decode_attention_mma4.cu.jinja"
COMBINE_TEMPLATE = "decode_attention_combine.cu.jinja"
COMBINE_HEADERS = ("trace_kernels/attention_decode_params.cuh", "trace_kernels/attention_split_combine.cuh")
DECODE_HEADERS = (*COMBINE_HEADERS, "trace_kernels/attention_decode.cuh")
FORMATS = ("nvfp4", "bf16")
HEAD_DIMS = (64, 128)  # shared-memory budget of the tile pipeline (attention_decode.cuh)
PAGE_SIZES = (16,)  # AOT set; any positive page size renders
THREADS = 128
MAX_HEADS_PER_CTA = 8  # FP32 q and accumulator registers: 2 * 8 * 8 per thread
MMA_MAX_HEADS_PER_CTA = 16  # the M rows of one m16n8k16 MMA
MMA2_MAX_HEADS_PER_CTA = 8  # the N columns of one m16n8k16 MMA (tokens are the M rows)
MMA2_WARPS, MMA2_STAGES = 2, 3  # 64-token tiles (32 per warp), 2 in flight; 29 KB, 7 CTAs per SM at D = 128
# "simt": FP32 CUDA-core math (attention_decode.cuh); "mma": tensor cores, q heads as MMA rows
# (attention_decode_mma.cuh); "mma2": NVFP4 only, tokens as MMA rows (attention_decode_mma2.cuh);
# "mma3": mma2's math with one page lookup per 16-token pass and lazy rescaling (attention_decode_mma3.cuh)
VARIANTS = ("simt", "mma", "mma2", "mma3")
NVFP4_ONLY_VARIANTS = ("mma2", "mma3")
MMA2_TEMPLATES = {"mma2": MMA2_TEMPLATE, "mma3": MMA3_TEMPLATE}
# Occupancy sweep of mma2 / mma3 (issue 5): "mma2_w4s2" = 4 warps (128-token tiles), 2 cp.async stages;
# optional "b<N>" = __launch_bounds__ min blocks per SM (caps registers at 64K / (N x threads)) and
# "h<N>" = q heads per CTA. The plain names keep the defaults above and their kernel names / sources.
MMA2_CONFIG = re.compile(r"^(mma2|mma3)_w(\d+)s(\d+)(?:b(\d+))?(?:h(\d+))?$")
MMA2_SWEEP_WARPS = (1, 2, 4)
MMA2_SWEEP_STAGES = (2, 3, 4)
SMEM_STATIC_LIMIT = 48 * 1024  # the kernel's shared memory is static
# The configurations profiling/run_gpu_checks_attention_sweep.sh measures against the default mma2
# (w2s3: 121 registers, 7 CTAs = 14 warps per SM by shared memory, 136 KB in flight). Per SM at D = 128,
# Hq 32 / Hkv 4, nvcc 13.0: registers, resident CTAs (limit) = warps, bytes in flight = (stages - 1)
# x tile bytes x CTAs. More than 16 warps needs <= 96 registers (5 warps per scheduler), which spills.
MMA2_SWEEP_VARIANTS = (
    "mma2_w1s3",  # 125 regs, 14 CTAs (smem) = 14 warps, 136 KB; no barrier shared by two warps
    "mma2_w1s2",  # 123 regs, 16 CTAs (regs) = 16 warps, 78 KB
    "mma2_w2s2",  # 124 regs, 8 CTAs (regs) = 16 warps, 78 KB
    "mma2_w4s2",  # 124 regs, 4 CTAs (regs) = 16 warps, 78 KB
    "mma2_w1s4",  # 140 regs, 11 CTAs (smem) = 11 warps, 160 KB
    "mma2_w2s4",  # 137 regs, 5 CTAs (smem) = 10 warps, 146 KB
    "mma3_w1s3",  # 118 regs, 14 CTAs (smem) = 14 warps, 136 KB; mma3's loader and lazy rescale
)
# "mma4" (NVFP4 only, attention_decode_mma4.cuh): mma2's tile body with every kv head of a (sequence,
# split) in one CTA, so a tile's page runs are contiguous and arrive by bulk copies. "mma4" = 2 warps
# (64 tokens) per kv head, 2 stages; "mma4_w<warps per kv head>s<stages>[b<min blocks>]" the other
# configurations; "mma4l" adds mma3's lazy rescaling. Dynamic shared memory. Without b<N>, min blocks =
# 16 warps / warps per CTA (at least 1): <= 128 registers, what mma2's tile body needs without spills.
MMA4_CONFIG = re.compile(r"^(mma4l?)(?:_w(\d+)s(\d+)(?:b(\d+))?)?$")
MMA4_DEFAULT = {"warps_per_head": 2, "stages": 2, "min_blocks": 0}  # min_blocks 0: 16 warps per SM
MMA4_MAX_SMEM = 227 * 1024  # per CTA on sm_90
MMA4_SWEEP_VARIANTS = ("mma4", "mma4l", "mma4_w1s2", "mma4l_w1s2", "mma4_w1s3")
# (Hq, Hkv, D, P) the sweep configurations are built for: the benchmark's shape and the sweep GPU test's
MMA2_SWEEP_TEST_SHAPES = ((32, 4, 128, 16), (64, 4, 128, 16), (8, 1, 64, 64))
# cache format -> (tokens per tile, pipeline stages): ~9.5 KB (NVFP4) / 16 KB (BF16) per stage at D=128
TILING = {"nvfp4": (64, 3), "bf16": (32, 2)}


def mma2_config(variant: str) -> dict | None:
    """{"base", "warps", "stages", "min_blocks", "heads"} of an mma2 / mma3 variant (None for the others);
    the plain "mma2" / "mma3" give the defaults (min_blocks 0 = no minimum, heads 0 = up to 8)."""
    if variant in MMA2_TEMPLATES:
        return {"base": variant, "warps": MMA2_WARPS, "stages": MMA2_STAGES, "min_blocks": 0, "heads": 0}
    m = MMA2_CONFIG.match(variant)
    if m is None:
        return None
    base, warps, stages, min_blocks, heads = m.groups()
    cfg = {"base": base, "warps": int(warps), "stages": int(stages), "min_blocks": int(min_blocks or 0),
           "heads": int(heads or 0)}
    if cfg["warps"] not in MMA2_SWEEP_WARPS or cfg["stages"] not in MMA2_SWEEP_STAGES:
        raise ValueError(f"{NAME}: variant {variant!r}: warps must be in {MMA2_SWEEP_WARPS} and stages in "
                         f"{MMA2_SWEEP_STAGES}")
    if not 0 <= cfg["min_blocks"] <= 32 or cfg["heads"] not in (0, 1, 2, 4, 8):
        raise ValueError(f"{NAME}: variant {variant!r}: min blocks must be 0..32 and heads 1, 2, 4 or 8")
    return cfg


def mma4_config(variant: str) -> dict | None:
    """{"lean", "warps_per_head", "stages", "min_blocks"} of an mma4 variant (None for the others)."""
    m = MMA4_CONFIG.match(variant)
    if m is None:
        return None
    base, warps, stages, min_blocks = m.groups()
    if warps is None:
        cfg = dict(MMA4_DEFAULT)
    else:
        cfg = {"warps_per_head": int(warps), "stages": int(stages), "min_blocks": int(min_blocks or 0)}
    cfg["lean"] = base == "mma4l"
    if cfg["warps_per_head"] not in (1, 2, 4) or not 2 <= cfg["stages"] <= 4 or not 0 <= cfg["min_blocks"] <= 32:
        raise ValueError(f"{NAME}: variant {variant!r}: warps per kv head must be 1, 2 or 4, stages 2..4 and min "
                         f"blocks 0..32")
    return cfg


def mma4_stage_bytes(head_dim: int, kv_heads: int, tile_tokens: int) -> int:
    """DecodeAttentionMma4Config::kStageBytes: K and V codes, block scales and row scales of every kv head,
    then the stage's mbarrier (8 bytes), rounded up to 128 bytes."""
    return -(-(tile_tokens * kv_heads * 2 * (head_dim // 2 + head_dim // 16 + 4) + 8) // 128) * 128


def mma4_tiling(q_heads: int, kv_heads: int, head_dim: int, page_size: int, variant: str) -> dict:
    """Launch geometry of an mma4 variant; raises for shapes it does not take."""
    config = mma4_config(variant)
    t = tiling("nvfp4", q_heads, kv_heads, head_dim, page_size, "mma2")  # shared checks (format, D, GQA)
    tile_tokens = 32 * config["warps_per_head"]
    if page_size % 16 or (tile_tokens % page_size and page_size % tile_tokens):
        raise ValueError(f"{NAME}: variant {variant!r} copies whole page runs: the page size must be a multiple of "
                         f"16 that divides or is divided by the {tile_tokens}-token tile, got {page_size}")
    warps = kv_heads * config["warps_per_head"]
    config["min_blocks"] = config["min_blocks"] or max(1, 16 // warps)
    if warps > 32:
        raise ValueError(f"{NAME}: variant {variant!r} needs {warps} warps per CTA for {kv_heads} kv heads (max 32)")
    smem = max(config["stages"] * mma4_stage_bytes(head_dim, kv_heads, tile_tokens), 4 * warps * (8 * head_dim + 24))
    if smem > MMA4_MAX_SMEM:
        raise ValueError(f"{NAME}: variant {variant!r} needs {smem} B of shared memory per CTA (max {MMA4_MAX_SMEM})")
    return {**t, "tile_tokens": tile_tokens, "stages": config["stages"], "warps_per_head": config["warps_per_head"],
            "smem": smem, "threads": 32 * warps, "ctas_per_split": t["head_groups"], **config}


def mma2_stage_bytes(head_dim: int, tile_tokens: int) -> int:
    """Shared bytes of one mma2 / mma3 pipeline stage: K and V codes, block scales and row scales."""
    return tile_tokens * 2 * (head_dim // 2 + head_dim // 16 + 4)


def check_heads(q_heads: int, kv_heads: int, head_dim: int) -> None:
    """Raise UnsupportedShape (a ValueError) for head counts and sizes no decode kernel takes."""
    if head_dim not in HEAD_DIMS:
        raise UnsupportedShape(f"{NAME}: head_dim {head_dim} is not supported (supported: "
                               f"{', '.join(map(str, HEAD_DIMS))})")
    if kv_heads <= 0 or q_heads <= 0 or q_heads % kv_heads:
        raise UnsupportedShape(f"{NAME}: q_heads {q_heads} must be a positive multiple of kv_heads {kv_heads}")


def heads_per_cta(group: int, cap: int, power_of_two: bool = False) -> int:
    """q heads of one kv head that a CTA computes: the largest divisor of the GQA group up to cap, so the group's
    CTAs share it evenly (a power of two for the simt kernel's butterfly). A group of 5 (Llama 4) gives 5 MMA
    columns, 12 (GLM-4.5) 6, and the simt kernel 1 and 4."""
    return max(g for g in range(1, min(group, cap) + 1)
               if group % g == 0 and (not power_of_two or g & (g - 1) == 0))


def tiling(cache_format: str, q_heads: int, kv_heads: int, head_dim: int, page_size: int,
           variant: str = "simt") -> dict:
    if mma4_config(variant) is not None:
        if cache_format != "nvfp4":
            raise ValueError(f"{NAME}: variant {variant!r} reads NVFP4 pages only, got cache format {cache_format!r}")
        return mma4_tiling(q_heads, kv_heads, head_dim, page_size, variant)
    config = mma2_config(variant)
    if config is not None and variant not in MMA2_TEMPLATES:
        t = tiling(cache_format, q_heads, kv_heads, head_dim, page_size, config["base"])
        heads = min(config["heads"], t["group"]) if config["heads"] else t["heads_per_cta"]
        if t["group"] % heads:
            raise ValueError(f"{NAME}: variant {variant!r}: {heads} heads per CTA do not divide the group {t['group']}")
        tile_tokens = 32 * config["warps"]
        smem = max(config["stages"] * mma2_stage_bytes(head_dim, tile_tokens),
                   4 * config["warps"] * (8 * head_dim + 24))
        if smem > SMEM_STATIC_LIMIT:
            raise ValueError(f"{NAME}: variant {variant!r} needs {smem} B of shared memory (static limit "
                             f"{SMEM_STATIC_LIMIT})")
        return {**t, "heads_per_cta": heads, "head_groups": t["group"] // heads, "tile_tokens": tile_tokens,
                "stages": config["stages"]}
    if variant not in VARIANTS:
        raise ValueError(f"{NAME}: variant must be one of {VARIANTS}, got {variant!r}")
    if cache_format not in FORMATS:
        raise ValueError(f"{NAME}: cache format must be one of {FORMATS}, got {cache_format!r}")
    check_heads(q_heads, kv_heads, head_dim)
    group = q_heads // kv_heads
    if page_size <= 0:
        raise ValueError(f"{NAME}: page size must be positive, got {page_size}")
    if variant in NVFP4_ONLY_VARIANTS and cache_format != "nvfp4":
        raise ValueError(f"{NAME}: variant {variant!r} reads NVFP4 pages only, got cache format {cache_format!r}")
    if variant in MMA2_TEMPLATES:
        heads = heads_per_cta(group, MMA2_MAX_HEADS_PER_CTA)
        tile_tokens, stages = 32 * MMA2_WARPS, MMA2_STAGES
    elif variant == "mma":
        heads = heads_per_cta(group, MMA_MAX_HEADS_PER_CTA)
        tile_tokens, stages = (64, 3) if cache_format == "nvfp4" else (32, 3)  # 4 / 2 warps of 16 tokens
    else:
        heads = heads_per_cta(group, min(MAX_HEADS_PER_CTA, head_dim // 8), power_of_two=True)
        tile_tokens, stages = TILING[cache_format]
    return {"group": group, "heads_per_cta": heads, "head_groups": group // heads, "tile_tokens": tile_tokens,
            "stages": stages}


@functools.lru_cache(maxsize=None)  # memoized: built on every launch
def spec(cache_format: str, q_heads: int, kv_heads: int, head_dim: int, page_size: int,
         variant: str = "simt") -> KernelSpec:
    parts = (cache_format,) if variant == "simt" else (cache_format, variant)
    if mma4_config(variant) is not None:
        t = tiling(cache_format, q_heads, kv_heads, head_dim, page_size, variant)
        return KernelSpec(
            op=NAME,
            name=kernel_name(NAME, *parts, dims={"hq": q_heads, "hkv": kv_heads, "d": head_dim, "p": page_size}),
            template=MMA4_TEMPLATE,
            params={"d": head_dim, "hkv": kv_heads, "group": t["group"], "heads_per_cta": t["heads_per_cta"],
                    "page": page_size, "warps_per_head": t["warps_per_head"], "stages": t["stages"],
                    "min_blocks": t["min_blocks"], "lean": t["lean"]},
            launch={key: t[key] for key in ("threads", "group", "heads_per_cta", "head_groups", "tile_tokens", "stages",
                                            "smem", "ctas_per_split")},
            headers=(*DECODE_HEADERS, "trace_kernels/attention_decode_mma.cuh",
                     "trace_kernels/attention_decode_mma2.cuh", "trace_kernels/attention_decode_mma4.cuh",
                     "trace_kernels/bulk_copy.cuh"),
        )
    t = tiling(cache_format, q_heads, kv_heads, head_dim, page_size, variant)
    t["ctas_per_split"] = kv_heads * t["head_groups"]  # one kv head per CTA
    config = mma2_config(variant)
    if config is not None:
        warps = t["tile_tokens"] // 32
        return KernelSpec(
            op=NAME,
            name=kernel_name(NAME, *parts, dims={"hq": q_heads, "hkv": kv_heads, "d": head_dim, "p": page_size}),
            template=MMA2_TEMPLATES[config["base"]],
            params={"d": head_dim, "hkv": kv_heads, "group": t["group"], "heads_per_cta": t["heads_per_cta"],
                    "page": page_size, "warps": warps, "stages": t["stages"], "min_blocks": config["min_blocks"]},
            launch={"threads": 32 * warps, **t},
            headers=(*DECODE_HEADERS, "trace_kernels/attention_decode_mma.cuh",
                     "trace_kernels/attention_decode_mma2.cuh")
            + (("trace_kernels/attention_decode_mma3.cuh",) if config["base"] == "mma3" else ()),
        )
    return KernelSpec(
        op=NAME,
        name=kernel_name(NAME, *parts, dims={"hq": q_heads, "hkv": kv_heads, "d": head_dim, "p": page_size}),
        template=TEMPLATE if variant == "simt" else MMA_TEMPLATE,
        params={"nvfp4": cache_format == "nvfp4", "d": head_dim, "hkv": kv_heads, "group": t["group"],
                "heads_per_cta": t["heads_per_cta"], "page": page_size, "tile_tokens": t["tile_tokens"],
                "stages": t["stages"]},
        launch={"threads": THREADS if variant == "simt" or cache_format == "nvfp4" else 64, **t},
        headers=DECODE_HEADERS if variant == "simt" else (*DECODE_HEADERS, "trace_kernels/attention_decode_mma.cuh"),
    )


@functools.lru_cache(maxsize=None)  # memoized: built on every launch
def combine_spec(head_dim: int) -> KernelSpec:
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"{COMBINE_NAME}: head_dim {head_dim} is not supported (supported: {HEAD_DIMS})")
    return KernelSpec(op=NAME, name=kernel_name(COMBINE_NAME, dims={"d": head_dim}), template=COMBINE_TEMPLATE,
                      params={"d": head_dim, "threads": COMBINE_THREADS}, launch={"threads": COMBINE_THREADS},
                      headers=COMBINE_HEADERS)


def specs_for_shape(shape: ModelShape) -> list[KernelSpec]:
    check_heads(shape.q_heads, shape.kv_heads, shape.head_dim)
    specs = [spec(f, shape.q_heads, shape.kv_heads, shape.head_dim, p) for f in FORMATS for p in PAGE_SIZES]
    specs += [spec(f, shape.q_heads, shape.kv_heads, shape.head_dim, p, "mma") for f in FORMATS for p in PAGE_SIZES]
    specs += [spec("nvfp4", shape.q_heads, shape.kv_heads, shape.head_dim, p, v) for v in MMA2_TEMPLATES
              for p in PAGE_SIZES]
    from trace_kernels.attention import default_variant  # the launch default may be a tuned config
    for p in PAGE_SIZES:
        variant = default_variant("nvfp4", shape.q_heads, shape.kv_heads, shape.head_dim, p)
        if variant not in VARIANTS:
            specs.append(spec("nvfp4", shape.q_heads, shape.kv_heads, shape.head_dim, p, variant))
    return specs + [combine_spec(shape.head_dim)]


OP = OpCodegen(NAME, specs_for_shape, "paged split-KV decode attention (NVFP4 / BF16 pages) + split combine")
