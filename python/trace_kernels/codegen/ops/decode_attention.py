"""Codegen for `decode_attention`: split-KV paged decode over NVFP4 or BF16 pages, plus the combine.

One kernel per (cache format, variant, q heads, kv heads, head_dim, page size), e.g.
decode_attention_nvfp4_mma4l_hq32_hkv4_d128_p16_sm90a; the combine kernel depends on head_dim only.
"""

from __future__ import annotations

import functools
import re

from trace_kernels.codegen.registry import OpCodegen, UnsupportedShape
from trace_kernels.codegen.spec import KernelSpec, kernel_name
from trace_kernels.shapes import ModelShape

NAME = "decode_attention"
COMBINE_NAME = "decode_attention_combine"
COMBINE_THREADS = 256  # 8 warps (attention_split_combine.cuh), each a few whole split rows in flight
MMA_TEMPLATE = "decode_attention_mma.cu.jinja"
MMA2_TEMPLATE = "decode_attention_mma2.cu.jinja"
MMA4_TEMPLATE = "decode_attention_mma4.cu.jinja"
COMBINE_TEMPLATE = "decode_attention_combine.cu.jinja"
COMBINE_HEADERS = ("trace_kernels/attention_split_combine.cuh",)
DECODE_HEADERS = ("trace_kernels/attention_decode_params.cuh", "trace_kernels/attention_decode.cuh")
FORMATS = ("nvfp4", "bf16")
HEAD_DIMS = (64, 128)  # shared-memory budget of the tile pipeline (attention_decode.cuh)
PAGE_SIZES = (16,)  # AOT set; any positive page size renders
# The kernels (docs/kv_cache.md; the variants that lost their A/Bs were removed on 2026-12-05, the last tree with
# them is 9d9c541):
#   "mma"   BF16 pages only: tensor cores, q heads as MMA rows (attention_decode_mma.cuh)
#   "mma2_w<W>s<S>[b<N>][h<H>]"  NVFP4: tokens as MMA rows, one kv head per CTA, W warps of 32 tokens, S cp.async
#           stages, optional __launch_bounds__ min blocks N and H q heads per CTA (attention_decode_mma2.cuh); the
#           fallback of the shapes mma4l does not take is mma2_w2s2
#   "mma4l[_w<W>s<S>[b<N>]][_c16]"  NVFP4: mma2's tile body with every kv head of a (sequence, split) in one CTA and
#           lazy softmax rescaling (attention_decode_mma4.cuh), the default; _c16: up to 16 q heads per kv head in one
#           CTA (two n8 MMA column blocks sharing each dequantized fragment), for GQA groups above 8 (mma4l_w1s2_c16
#           their default)
MMA_MAX_HEADS_PER_CTA = 16  # the M rows of one m16n8k16 MMA
MMA2_MAX_HEADS_PER_CTA = 8  # the N columns of one m16n8k16 MMA (tokens are the M rows)
MMA4_WIDE_HEADS_PER_CTA = 16  # mma4l_c16: two MMA column blocks
MMA2_CONFIG = re.compile(r"^mma2_w(\d+)s(\d+)(?:b(\d+))?(?:h(\d+))?$")
MMA2_WARP_CHOICES = (1, 2, 4)
MMA2_STAGE_CHOICES = (2, 3, 4)
SMEM_STATIC_LIMIT = 48 * 1024  # mma2's shared memory is static
# "mma4l" = 2 warps (64 tokens) per kv head, 2 stages; "mma4l_w<warps per kv head>s<stages>[b<min blocks>]" the other
# configurations. Dynamic shared memory. Without b<N>, min blocks = 16 warps / warps per CTA (at least 1): <= 128
# registers, what mma2's tile body needs without spills; _c16 (twice the per-column registers: ~180 at D 128) 8 warps /
# warps per CTA.
MMA4_CONFIG = re.compile(r"^mma4l(?:_w(\d+)s(\d+)(?:b(\d+))?)?(_c16)?$")
MMA4_DEFAULT = {"warps_per_head": 2, "stages": 2, "min_blocks": 0}  # min_blocks 0: 16 warps per SM (c16: 8)
# "mma4l_c16": one CTA of 8 warps per SM at D 128 (~180 registers), so 4 stages keep as many bytes in flight per SM as
# mma4l's two CTAs of 2 stages; warps per kv head 0: 2 up to MMA4_WIDE_WARPS / 2 kv heads, 1 beyond (16 warps would
# spill at 128 registers)
MMA4_WIDE_DEFAULT = {"warps_per_head": 0, "stages": 4, "min_blocks": 0}
MMA4_WIDE_WARPS = 8  # warps per SM the wide tile body's registers allow at D 128
MMA4_MAX_SMEM = 227 * 1024  # per CTA on sm_90
# The configurations the GPU tests run besides the defaults (the occupancy sweeps of 2026-11-29 and 2026-12-02 chose
# mma2_w2s2 and mma4l; docs/kv_cache.md) and the (Hq, Hkv, D, P) they are built for
CONFIG_TEST_VARIANTS = ("mma2_w1s2", "mma2_w4s2", "mma4l_w1s2", "mma4l_w4s2", "mma4l_w1s3")
CONFIG_TEST_SHAPES = ((32, 4, 128, 16), (64, 4, 128, 16), (8, 1, 64, 64))
# mma4l_c16 (GQA groups above 8 in one CTA per kv head; its w1s2 form is their default, attention.py) and the
# (Hq, Hkv, D, P) the GPU tests build it for: Qwen3-235B-A22B's GQA 16, GLM-4.5's GQA 12 at D 128 and at D 64 with
# 64-token pages
WIDE_TEST_VARIANTS = ("mma4l_c16", "mma4l_w1s4_c16", "mma4l_w1s2_c16")
WIDE_TEST_SHAPES = ((64, 4, 128, 16), (96, 8, 128, 16), (24, 2, 64, 64))


def mma2_config(variant: str) -> dict | None:
    """{"warps", "stages", "min_blocks", "heads"} of an mma2 variant (None for the others; min_blocks 0 = no minimum,
    heads 0 = the largest divisor of the GQA group up to 8)."""
    m = MMA2_CONFIG.match(variant)
    if m is None:
        return None
    warps, stages, min_blocks, heads = m.groups()
    cfg = {"warps": int(warps), "stages": int(stages), "min_blocks": int(min_blocks or 0), "heads": int(heads or 0)}
    if cfg["warps"] not in MMA2_WARP_CHOICES or cfg["stages"] not in MMA2_STAGE_CHOICES:
        raise ValueError(f"{NAME}: variant {variant!r}: warps must be in {MMA2_WARP_CHOICES} and stages in "
                         f"{MMA2_STAGE_CHOICES}")
    if not 0 <= cfg["min_blocks"] <= 32 or cfg["heads"] not in (0, 1, 2, 4, 8):
        raise ValueError(f"{NAME}: variant {variant!r}: min blocks must be 0..32 and heads 1, 2, 4 or 8")
    return cfg


def mma4_config(variant: str) -> dict | None:
    """{"warps_per_head", "stages", "min_blocks", "columns"} of an mma4l variant (None for the others; columns: the most
    q heads per kv head a CTA takes, 8 or, _c16, 16)."""
    m = MMA4_CONFIG.match(variant)
    if m is None:
        return None
    warps, stages, min_blocks, wide = m.groups()
    if warps is not None:
        cfg = {"warps_per_head": int(warps), "stages": int(stages), "min_blocks": int(min_blocks or 0)}
        if cfg["warps_per_head"] not in (1, 2, 4) or not 2 <= cfg["stages"] <= 4 or not 0 <= cfg["min_blocks"] <= 32:
            raise ValueError(f"{NAME}: variant {variant!r}: warps per kv head must be 1, 2 or 4, stages 2..4 and min "
                             f"blocks 0..32")
    elif wide:
        cfg = dict(MMA4_WIDE_DEFAULT)
    else:
        cfg = dict(MMA4_DEFAULT)
    cfg["columns"] = MMA4_WIDE_HEADS_PER_CTA if wide else MMA2_MAX_HEADS_PER_CTA
    return cfg


def mma4_stage_bytes(head_dim: int, kv_heads: int, tile_tokens: int) -> int:
    """DecodeAttentionMma4Config::kStageBytes: K and V codes, block scales and row scales of every kv head,
    then the stage's mbarrier (8 bytes), rounded up to 128 bytes."""
    return -(-(tile_tokens * kv_heads * 2 * (head_dim // 2 + head_dim // 16 + 4) + 8) // 128) * 128


def mma2_stage_bytes(head_dim: int, tile_tokens: int) -> int:
    """Shared bytes of one mma2 pipeline stage: K and V codes, block scales and row scales."""
    return tile_tokens * 2 * (head_dim // 2 + head_dim // 16 + 4)


def check_heads(q_heads: int, kv_heads: int, head_dim: int) -> None:
    """Raise UnsupportedShape (a ValueError) for head counts and sizes no decode kernel takes."""
    if head_dim not in HEAD_DIMS:
        raise UnsupportedShape(f"{NAME}: head_dim {head_dim} is not supported (supported: "
                               f"{', '.join(map(str, HEAD_DIMS))})")
    if kv_heads <= 0 or q_heads <= 0 or q_heads % kv_heads:
        raise UnsupportedShape(f"{NAME}: q_heads {q_heads} must be a positive multiple of kv_heads {kv_heads}")


def heads_per_cta(group: int, cap: int) -> int:
    """q heads of one kv head that a CTA computes: the largest divisor of the GQA group up to cap, so the group's
    CTAs share it evenly. A group of 5 (Llama 4) gives 5 MMA columns, 12 (GLM-4.5) 6 (mma2, mma4l) or 12 (mma)."""
    return max(g for g in range(1, min(group, cap) + 1) if group % g == 0)


def _check_shape(cache_format: str, q_heads: int, kv_heads: int, head_dim: int, page_size: int, variant: str) -> int:
    """The checks every kernel shares; returns the GQA group."""
    if cache_format not in FORMATS:
        raise ValueError(f"{NAME}: cache format must be one of {FORMATS}, got {cache_format!r}")
    check_heads(q_heads, kv_heads, head_dim)
    if page_size <= 0:
        raise ValueError(f"{NAME}: page size must be positive, got {page_size}")
    if variant != "mma" and cache_format != "nvfp4":
        raise ValueError(f"{NAME}: variant {variant!r} reads NVFP4 pages only, got cache format {cache_format!r}")
    if variant == "mma" and cache_format != "bf16":
        raise ValueError(f"{NAME}: variant 'mma' reads BF16 pages only (NVFP4 pages: mma4l or mma2_w<W>s<S>)")
    return q_heads // kv_heads


def _mma2_tiling(config: dict, group: int, kv_heads: int, head_dim: int, variant: str) -> dict:
    heads = min(config["heads"], group) if config["heads"] else heads_per_cta(group, MMA2_MAX_HEADS_PER_CTA)
    if group % heads:
        raise ValueError(f"{NAME}: variant {variant!r}: {heads} heads per CTA do not divide the group {group}")
    tile_tokens = 32 * config["warps"]
    smem = max(config["stages"] * mma2_stage_bytes(head_dim, tile_tokens), 4 * config["warps"] * (8 * head_dim + 24))
    if smem > SMEM_STATIC_LIMIT:
        raise ValueError(f"{NAME}: variant {variant!r} needs {smem} B of shared memory (static limit "
                         f"{SMEM_STATIC_LIMIT})")
    return {"group": group, "heads_per_cta": heads, "head_groups": group // heads, "tile_tokens": tile_tokens,
            "stages": config["stages"], "warps": config["warps"], "min_blocks": config["min_blocks"],
            "threads": 32 * config["warps"], "ctas_per_split": kv_heads * (group // heads)}


def _mma4_tiling(config: dict, group: int, kv_heads: int, head_dim: int, page_size: int, variant: str) -> dict:
    if config["columns"] > MMA2_MAX_HEADS_PER_CTA and group <= MMA2_MAX_HEADS_PER_CTA:
        raise ValueError(f"{NAME}: variant {variant!r} is for GQA groups above {MMA2_MAX_HEADS_PER_CTA} (got "
                         f"{group}); groups up to {MMA2_MAX_HEADS_PER_CTA} fit one MMA column block: use mma4l")
    heads = heads_per_cta(group, config["columns"])  # mma2's tile body per kv head, 1 or 2 column blocks
    if not config["warps_per_head"]:  # mma4l_c16's default: 2 warps per kv head while the CTA has at most 8 warps
        config["warps_per_head"] = 2 if 2 * kv_heads <= MMA4_WIDE_WARPS else 1
    tile_tokens = 32 * config["warps_per_head"]
    if page_size % 16 or (tile_tokens % page_size and page_size % tile_tokens):
        raise ValueError(f"{NAME}: variant {variant!r} copies whole page runs: the page size must be a multiple of "
                         f"16 that divides or is divided by the {tile_tokens}-token tile, got {page_size}")
    warps = kv_heads * config["warps_per_head"]
    warps_per_sm = 16 if heads <= MMA2_MAX_HEADS_PER_CTA else MMA4_WIDE_WARPS
    config["min_blocks"] = config["min_blocks"] or max(1, warps_per_sm // warps)
    if warps > 32:
        raise ValueError(f"{NAME}: variant {variant!r} needs {warps} warps per CTA for {kv_heads} kv heads (max 32)")
    smem = max(config["stages"] * mma4_stage_bytes(head_dim, kv_heads, tile_tokens), 4 * warps * (8 * head_dim + 24))
    if smem > MMA4_MAX_SMEM:
        raise ValueError(f"{NAME}: variant {variant!r} needs {smem} B of shared memory per CTA (max {MMA4_MAX_SMEM})")
    return {"group": group, "heads_per_cta": heads, "head_groups": group // heads, "tile_tokens": tile_tokens,
            "smem": smem, "threads": 32 * warps, "ctas_per_split": group // heads, **config}


def _mma_tiling(group: int, kv_heads: int) -> dict:
    heads = heads_per_cta(group, MMA_MAX_HEADS_PER_CTA)
    return {"group": group, "heads_per_cta": heads, "head_groups": group // heads, "tile_tokens": 32, "stages": 3,
            "threads": 64, "ctas_per_split": kv_heads * (group // heads)}  # 2 warps of 16 tokens, one kv head per CTA


def tiling(cache_format: str, q_heads: int, kv_heads: int, head_dim: int, page_size: int, variant: str) -> dict:
    """Launch geometry of a variant at a shape; raises ValueError for the shapes and formats it does not take."""
    mma4, mma2 = mma4_config(variant), mma2_config(variant)
    if mma4 is None and mma2 is None and variant != "mma":
        raise ValueError(f"{NAME}: variant must be 'mma' (BF16 pages), 'mma4l[_w<W>s<S>[b<N>]]' or "
                         f"'mma2_w<W>s<S>[b<N>][h<H>]' (NVFP4 pages), got {variant!r}")
    group = _check_shape(cache_format, q_heads, kv_heads, head_dim, page_size, variant)
    if mma4 is not None:
        return _mma4_tiling(mma4, group, kv_heads, head_dim, page_size, variant)
    if mma2 is not None:
        return _mma2_tiling(mma2, group, kv_heads, head_dim, variant)
    return _mma_tiling(group, kv_heads)


_LAUNCH_KEYS = ("threads", "group", "heads_per_cta", "head_groups", "tile_tokens", "stages", "ctas_per_split")


@functools.lru_cache(maxsize=None)  # memoized: built on every launch
def spec(cache_format: str, q_heads: int, kv_heads: int, head_dim: int, page_size: int, variant: str) -> KernelSpec:
    t = tiling(cache_format, q_heads, kv_heads, head_dim, page_size, variant)
    name = kernel_name(NAME, cache_format, variant, dims={"hq": q_heads, "hkv": kv_heads, "d": head_dim,
                                                          "p": page_size})
    common = {"d": head_dim, "hkv": kv_heads, "group": t["group"], "heads_per_cta": t["heads_per_cta"],
              "page": page_size, "stages": t["stages"]}
    mma_headers = (*DECODE_HEADERS, "trace_kernels/attention_decode_mma.cuh")
    if mma4_config(variant) is not None:
        return KernelSpec(
            op=NAME, name=name, template=MMA4_TEMPLATE,
            params={**common, "warps_per_head": t["warps_per_head"], "min_blocks": t["min_blocks"]},
            launch={key: t[key] for key in (*_LAUNCH_KEYS, "smem")},
            headers=(*mma_headers, "trace_kernels/attention_decode_mma2.cuh",
                     "trace_kernels/attention_decode_mma4.cuh", "trace_kernels/bulk_copy.cuh"),
        )
    if mma2_config(variant) is not None:
        return KernelSpec(
            op=NAME, name=name, template=MMA2_TEMPLATE,
            params={**common, "warps": t["warps"], "min_blocks": t["min_blocks"]},
            launch={key: t[key] for key in _LAUNCH_KEYS},
            headers=(*mma_headers, "trace_kernels/attention_decode_mma2.cuh"),
        )
    return KernelSpec(op=NAME, name=name, template=MMA_TEMPLATE, params=common,
                      launch={key: t[key] for key in _LAUNCH_KEYS}, headers=mma_headers)


@functools.lru_cache(maxsize=None)  # memoized: built on every launch
def combine_spec(head_dim: int) -> KernelSpec:
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"{COMBINE_NAME}: head_dim {head_dim} is not supported (supported: {HEAD_DIMS})")
    return KernelSpec(op=NAME, name=kernel_name(COMBINE_NAME, dims={"d": head_dim}), template=COMBINE_TEMPLATE,
                      params={"d": head_dim, "threads": COMBINE_THREADS}, launch={"threads": COMBINE_THREADS},
                      headers=COMBINE_HEADERS)


def specs_for_shape(shape: ModelShape) -> list[KernelSpec]:
    """The kernels a decode of this shape launches: the NVFP4 default (or its fallback), BF16's mma, the combine."""
    from trace_kernels.attention import default_variant  # the launch default: mma4l where it takes the shape
    check_heads(shape.q_heads, shape.kv_heads, shape.head_dim)
    specs = []
    for p in PAGE_SIZES:
        specs.append(spec("nvfp4", shape.q_heads, shape.kv_heads, shape.head_dim, p,
                          default_variant("nvfp4", shape.q_heads, shape.kv_heads, shape.head_dim, p)))
        specs.append(spec("bf16", shape.q_heads, shape.kv_heads, shape.head_dim, p, "mma"))
    return specs + [combine_spec(shape.head_dim)]


OP = OpCodegen(NAME, specs_for_shape, "paged split-KV decode attention (NVFP4 / BF16 pages) + split combine")
