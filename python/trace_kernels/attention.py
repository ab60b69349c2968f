"""Attention over the paged KV cache (NVFP4 or BF16 pages, docs/kv_cache.md).

    out = decode_attention(q, k_pages, v_pages, block_table, lengths)          # q bf16 [B, Hq, D]
    out = extend_attention(q, k_pages, v_pages, block_table, lengths)          # q [B, Tq, Hq, D]

decode_attention: one new token per sequence; GPU = split-KV flash-decoding kernels
(cuda/include/trace_kernels/attention_decode.cuh) + a combine; CPU = the reference, which
dequantizes the pages in FP32 (value(code) * b * s), runs FP32 softmax attention and rounds to BF16.
extend_attention (prefill / extend): gathers and dequantizes the same pages in FP32 - the values
the decode kernel computes with - (kv_gather) and calls torch's scaled_dot_product_attention.
"""

from __future__ import annotations

import ctypes
import functools
import math
from typing import TYPE_CHECKING, NamedTuple, Optional

import torch
import torch.nn.functional as F

from trace_kernels import kv_cache, nvtx
from trace_kernels.kv_gather import kv_gather

if TYPE_CHECKING:
    from trace_kernels.codegen.spec import KernelSpec
    from trace_kernels.runtime import CudaKernel


# ----------------------------------------------------------------------------------------------
# Validation (before any launch)
# ----------------------------------------------------------------------------------------------

def validate(q, k_cache, v_cache, block_table, lengths, *, check_values: bool, q_rank: int = 3
             ) -> kv_cache.PageGeometry:
    geom = kv_cache.cache_geometry(k_cache, v_cache)
    device = kv_cache.cache_device(k_cache)
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    layout = "[B, Hq, D]" if q_rank == 3 else "[B, Tq, Hq, D]"
    if q.dim() != q_rank:
        raise ValueError(f"q must be {layout}, got shape {tuple(q.shape)}")
    if q.device != device:
        raise ValueError(f"q is on {q.device} but the KV cache is on {device}")
    hq, d = q.shape[-2], q.shape[-1]
    if d != geom.head_dim:
        raise ValueError(f"q has head_dim {d} but the KV cache has {geom.head_dim}")
    if hq % geom.kv_heads:
        raise ValueError(f"q has {hq} heads, not a multiple of the cache's {geom.kv_heads} kv heads")
    kv_cache.check_block_table(block_table, lengths, geom, device, batch=q.shape[0], check_values=check_values)
    return geom


def _default_scale(softmax_scale: float | None, head_dim: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    scale = float(softmax_scale)
    if not (math.isfinite(scale) and scale > 0):  # a NaN or Inf scale would give NaN outputs without an error
        raise ValueError(f"softmax_scale must be a positive finite number, got {softmax_scale!r}")
    return scale


# ----------------------------------------------------------------------------------------------
# References
# ----------------------------------------------------------------------------------------------

def gather_kv(k_cache, v_cache, block_table, lengths, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V of every position [B, max_pages * P, Hkv, D] in dtype (positions >= length read slot 0)."""
    geom = kv_cache.cache_geometry(k_cache, v_cache)
    slots = kv_cache.slot_table(block_table, geom.page_size, lengths)  # [B, S]
    return kv_cache.gather_slots(k_cache, slots, dtype), kv_cache.gather_slots(v_cache, slots, dtype)


def decode_attention_reference(q, k_cache, v_cache, block_table, lengths, softmax_scale: float | None = None
                               ) -> torch.Tensor:
    """FP32 attention of q [B, Hq, D] over positions 0..length-1 of each sequence -> bf16 [B, Hq, D]."""
    b, hq, d = q.shape
    keys, values = gather_kv(k_cache, v_cache, block_table, lengths)  # [B, S, Hkv, D] f32
    group = hq // keys.shape[2]
    keys = keys.repeat_interleave(group, dim=2)  # [B, S, Hq, D]
    values = values.repeat_interleave(group, dim=2)
    scores = torch.einsum("bhd,bshd->bhs", q.float(), keys) * _default_scale(softmax_scale, d)  # [B, Hq, S]
    pos = torch.arange(keys.shape[1], device=q.device)
    scores = scores.masked_fill(pos[None, None, :] >= lengths.long()[:, None, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("bhs,bshd->bhd", probs, values).to(torch.bfloat16)


def extend_attention(q, k_cache, v_cache, block_table, lengths, query_positions: torch.Tensor | None = None,
                     softmax_scale: float | None = None, *, check_values: bool = True) -> torch.Tensor:
    """Prefill / extend attention over the paged cache: q [B, Tq, Hq, D] -> [B, Tq, Hq, D] (q's dtype).

    query_positions int64 [B, Tq] (default: the last Tq positions, lengths - Tq .. lengths - 1);
    query i of sequence b attends to positions <= query_positions[b, i] that are < lengths[b]. The
    new tokens must already be in the cache (kv_append first), so prefill and decode read the same
    bytes. K/V are dequantized in FP32 exactly as the decode kernel's values, then cast to q's
    dtype for SDPA (BF16 q: one BF16 rounding of each dequantized value, relative error <= 2^-9;
    pass FP32 q for no rounding at all): kv_gather, one kernel launch for NVFP4 pages on the GPU.
    """
    geom = validate(q, k_cache, v_cache, block_table, lengths, check_values=check_values, q_rank=4)
    if q.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"q must be bfloat16, float16 or float32 (the dtype K/V are gathered in), got {q.dtype}")
    b, tq, hq, d = q.shape
    if query_positions is None:
        query_positions = lengths.long()[:, None] - tq + torch.arange(tq, device=q.device)[None, :]
    if tuple(query_positions.shape) != (b, tq):
        raise ValueError(f"query_positions must be [B, Tq] = [{b}, {tq}], got {tuple(query_positions.shape)}")
    # [B, S, Hkv, D] each
    keys, values = kv_gather(k_cache, v_cache, block_table, lengths, dtype=q.dtype, check_values=False)
    # The last key each query sees: its own position, at most length - 1, at least 0 (a query before position 0,
    # i.e. padding, keeps key 0 so its softmax stays finite).
    last = torch.minimum(query_positions.long(), lengths.long()[:, None] - 1).clamp_(min=0)  # [B, Tq]
    pos = torch.arange(keys.shape[1], device=q.device)
    # additive in q's dtype, built by one kernel: what SDPA would turn a boolean mask into with a second
    mask = torch.where(pos[None, None, :] <= last[:, :, None], q.new_zeros(()), float("-inf"))  # [B, Tq, S]
    with nvtx.annotate("extend_attention"):
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                             attn_mask=mask[:, None], scale=_default_scale(softmax_scale, d),
                                             enable_gqa=hq != geom.kv_heads)
    return out.transpose(1, 2)


# ----------------------------------------------------------------------------------------------
# GPU launch
# ----------------------------------------------------------------------------------------------

class _DecodeParams(ctypes.Structure):  # trace_kernels::DecodeParams
    _fields_ = [(name, ctypes.c_void_p) for name in (
        "q", "k_codes", "v_codes", "k_block_scales", "v_block_scales", "k_scale", "v_scale", "block_table",
        "lengths", "out", "o_part", "lse_part")] + [
        ("max_pages", ctypes.c_int32), ("tiles_per_split", ctypes.c_int32), ("scale_log2", ctypes.c_float)]


MAX_SPLITS = 256
# decode kernel per page format (docs/kv_cache.md; codegen.ops.decode_attention lists the variants). NVFP4: mma4l
# (every kv head of a (sequence, split) in one CTA, whole pages by bulk copies, lazy rescaling). In same-run A/Bs on
# the H200 its eager form was 5-11% faster than mma2_w2s2 (one kv head per CTA) at L >= 32K
# (profiling/results/attention_kv_codes_h200.json) and mma4l 2-3% faster than the eager form
# (attention_kv_codes_sweep_h200.json); mma2_w2s2 takes the shapes mma4l does not. BF16: mma (q heads as MMA rows),
# 1.6-2x the FP32 CUDA-core kernel it replaced.
DEFAULT_NVFP4_VARIANT = "mma4l"
# GQA groups of 9-16 q heads per kv head: one CTA per kv head's group (two MMA column blocks sharing each dequantized K
# / V fragment) instead of mma4l's two CTAs that each read and dequantize every byte. Same-call A/B on an H100
# (thirty-fourth session, profiling/results/attention_decode_wide_gqa{16,12}_h100*.json, two rounds at Qwen3-235B-A22B's
# 64 x 4 heads, one at GLM-4.5's 96 x 8): at 8 x 32K / 4 x 128K / 32 x 32K 15-21% faster at GQA 16 (32 x 32K 0.377-0.379
# -> 0.298-0.304 ms) and 19-22% at GQA 12; at 8 x 8K the same at GQA 16, 13% faster at GQA 12. Its one-warp-per-kv-head,
# 2-stage form ran as fast as mma4l_c16 at GQA 12 and up to 12% faster at GQA 16. On the H200 (thirty-fifth session,
# attention_new_defaults_gqa16_h200.json) 16-21% faster than mma4l at GQA 16 from 32K on (32 x 32K 0.382 -> 0.301 ms).
DEFAULT_NVFP4_WIDE_VARIANT = "mma4l_w1s2_c16"
NVFP4_FALLBACK_VARIANT = "mma2_w2s2"
DEFAULT_BF16_VARIANT = "mma"
# The decode kernel as a programmatic dependent launch (pdl.cuh): its CTAs may start while the previous kernel on the
# stream finishes and wait for it before their first read (split_range in attention_decode.cuh). False launches it
# as an ordinary kernel (the A/B of bench_attention.py --decode-pdl).
DECODE_PDL = True


@functools.lru_cache(maxsize=None)  # memoized: asked on every launch without variant=
def default_variant(cache_format: str, q_heads: int, kv_heads: int, head_dim: int, page_size: int) -> str:
    """The kernel a decode launches without variant=: DEFAULT_NVFP4_WIDE_VARIANT for GQA groups above 8, else (or
    where it does not take the shape) DEFAULT_NVFP4_VARIANT where that takes it (page sizes, kv heads per CTA), else
    NVFP4_FALLBACK_VARIANT; DEFAULT_BF16_VARIANT for BF16 pages."""
    from trace_kernels.codegen.ops import decode_attention as codegen
    if cache_format != "nvfp4":
        return DEFAULT_BF16_VARIANT
    wide = kv_heads > 0 and q_heads % kv_heads == 0 and q_heads // kv_heads > codegen.MMA2_MAX_HEADS_PER_CTA
    for variant in (DEFAULT_NVFP4_WIDE_VARIANT,) * wide + (DEFAULT_NVFP4_VARIANT,):
        try:
            codegen.tiling("nvfp4", q_heads, kv_heads, head_dim, page_size, variant)
        except ValueError:
            continue
        return variant
    return NVFP4_FALLBACK_VARIANT


class SplitPlan(NamedTuple):
    """Split-KV launch plan: split s covers tiles [s x tiles_per_split, (s + 1) x tiles_per_split) (split_range in
    attention_decode.cuh)."""
    splits: int
    tiles_per_split: int


@functools.lru_cache(maxsize=1024)
def plan_splits(batch: int, ctas_per_split: int, max_tokens: int, tile_tokens: int, resident_ctas: int,
                num_splits: int | None = None) -> SplitPlan:
    """The split-KV plan from shapes only (no host sync, CUDA-graph safe).

    resident_ctas = SMs x CTAs per SM. Picks the split count with the least modelled time
    waves x (tiles per split + 1): whole waves of resident CTAs (a partly filled last wave costs a
    full one), plus about one tile of prologue / epilogue per CTA; ties go to fewer splits.
    """
    tiles = max(1, -(-max_tokens // tile_tokens))
    base = max(1, batch * ctas_per_split)
    if num_splits is None:
        best = None
        for s in range(1, min(tiles, MAX_SPLITS) + 1):
            per_split = -(-tiles // s)
            s_eff = -(-tiles // per_split)
            cost = -(-base * s_eff // max(1, resident_ctas)) * (per_split + 1)
            if best is None or cost < best[0]:
                best = (cost, s_eff)
        num_splits = best[1]
    num_splits = max(1, min(int(num_splits), tiles, 65535))
    per_split = -(-tiles // num_splits)
    return SplitPlan(-(-tiles // per_split), per_split)


class DecodeLaunch(NamedTuple):
    spec: KernelSpec      # launch geometry in spec.launch
    kernel: CudaKernel    # loaded for the device
    plan: SplitPlan
    resident_ctas: int    # SMs x CTAs per SM (occupancy query)


def decode_launch_plan(cache_format: str, batch: int, q_heads: int, kv_heads: int, head_dim: int, page_size: int,
                       max_pages: int, device: int, variant: str | None = None,
                       num_splits: int | None = None) -> DecodeLaunch:
    """The kernel and split plan of a decode launch over a block table of max_pages columns on a CUDA device: the
    variant (default_variant when None), its occupancy there and the split plan from shapes alone."""
    from trace_kernels.codegen.ops import decode_attention as codegen
    from trace_kernels.ops._common import resident_ctas
    from trace_kernels.runtime import kernel_for
    if variant is None:
        variant = default_variant(cache_format, q_heads, kv_heads, head_dim, page_size)
    spec = codegen.spec(cache_format, q_heads, kv_heads, head_dim, page_size, variant)
    kernel = kernel_for(spec)
    smem = spec.launch.get("smem", 0)
    kernel.allow_dynamic_smem(device, smem)
    resident = resident_ctas(kernel, device, spec.launch["threads"], smem)
    plan = plan_splits(batch, spec.launch["ctas_per_split"], max_pages * page_size, spec.launch["tile_tokens"],
                       resident, num_splits)
    return DecodeLaunch(spec, kernel, plan, resident)


def _launch_decode(q, k_cache, v_cache, block_table, lengths, geom, softmax_scale, num_splits, variant):
    from trace_kernels.codegen.ops import decode_attention as codegen
    from trace_kernels.ops._common import check_cuda_device, check_tensor, new_output
    from trace_kernels.runtime import i32, kernel_for, ptr, struct
    device = check_cuda_device(q)
    check_tensor(q, "q")
    for t, name in ((block_table, "block_table"), (lengths, "lengths")):
        check_tensor(t, name, aligned=False)
    for pages, prefix in ((k_cache, "k_cache"), (v_cache, "v_cache")):
        for t in kv_cache.page_tensors(pages):
            check_tensor(t, prefix)
    b, hq, d = q.shape
    out = new_output((b, hq, d), torch.bfloat16, q.device)
    if b == 0:
        return out
    spec, kernel, plan, _ = decode_launch_plan("nvfp4" if geom.nvfp4 else "bf16", b, hq, geom.kv_heads, d,
                                               geom.page_size, block_table.shape[1], device, variant, num_splits)
    smem = spec.launch.get("smem", 0)  # dynamic shared memory (mma4)
    ctas_per_split = spec.launch["ctas_per_split"]  # kv heads x head groups, or head groups (mma4: whole pages)
    splits = plan.splits
    o_part = lse = None
    if splits > 1:
        o_part = torch.empty((b, hq, splits, d), dtype=torch.float32, device=q.device)
        lse = torch.empty((b, hq, splits), dtype=torch.float32, device=q.device)
    if geom.nvfp4:
        tensors = (k_cache.codes, v_cache.codes, k_cache.block_scales, v_cache.block_scales, k_cache.scale,
                   v_cache.scale)
    else:
        tensors = (k_cache.data, v_cache.data, None, None, None, None)
    addr = lambda t: 0 if t is None else t.data_ptr()  # noqa: E731
    params = _DecodeParams(q.data_ptr(), *(addr(t) for t in tensors), block_table.data_ptr(), lengths.data_ptr(),
                           out.data_ptr(), addr(o_part), addr(lse), block_table.shape[1], plan.tiles_per_split,
                           _default_scale(softmax_scale, d) * math.log2(math.e))
    with nvtx.annotate("decode_attention"):
        kernel.launch(device, (ctas_per_split, splits, b), (spec.launch["threads"],),
                      [struct(params)], smem=smem, pdl=DECODE_PDL)
        if splits > 1:
            combine = codegen.combine_spec(d)
            kernel_for(combine).launch(device, (b * hq,), (combine.launch["threads"],),  # waits for the decode grid
                                       [ptr(o_part), ptr(lse), ptr(out), i32(splits)], pdl=True)
    return out


@torch.library.custom_op("trace_kernels::paged_decode_attention", mutates_args=())
def paged_decode_attention_op(q: torch.Tensor, k_data: torch.Tensor, v_data: torch.Tensor,
                              k_block_scales: Optional[torch.Tensor], v_block_scales: Optional[torch.Tensor],
                              k_scale: Optional[torch.Tensor], v_scale: Optional[torch.Tensor], block_table: torch.Tensor,
                              lengths: torch.Tensor, softmax_scale: float, num_splits: int, variant: str
                              ) -> torch.Tensor:
    """The op behind decode_attention (validated inputs). k_data / v_data: NVFP4 codes when the
    scales are given, else BF16 pages; num_splits 0 = planned from shapes; variant "" = default."""
    if k_block_scales is not None:
        k_cache = kv_cache.NVFP4Pages(k_data, k_block_scales, k_scale)
        v_cache = kv_cache.NVFP4Pages(v_data, v_block_scales, v_scale)
    else:
        k_cache, v_cache = kv_cache.BF16Pages(k_data), kv_cache.BF16Pages(v_data)
    if q.device.type == "cpu":
        return decode_attention_reference(q, k_cache, v_cache, block_table, lengths, softmax_scale)
    geom = kv_cache.cache_geometry(k_cache, v_cache)
    return _launch_decode(q, k_cache, v_cache, block_table, lengths, geom, softmax_scale, num_splits or None,
                          variant or None)


@paged_decode_attention_op.register_fake
def _(q, k_data, v_data, k_block_scales, v_block_scales, k_scale, v_scale, block_table, lengths, softmax_scale,
      num_splits, variant):
    return torch.empty_like(q)


def decode_attention(q: torch.Tensor, k_cache, v_cache, block_table: torch.Tensor, lengths: torch.Tensor,
                     softmax_scale: float | None = None, *, check_values: bool = True,
                     num_splits: int | None = None, variant: str | None = None) -> torch.Tensor:
    """Paged decode attention: q bf16 [B, Hq, D] -> bf16 [B, Hq, D].

    k_cache / v_cache: NVFP4Pages or BF16Pages (or objects with the same tensor attributes);
    block_table int32 [B, max_pages]; lengths int32 [B] (each in 1 .. max_pages * P);
    softmax_scale defaults to 1/sqrt(D). check_values=True reads lengths and the block table on the
    host (one sync) and raises on lengths beyond the table or pages outside the cache; pass False in
    CUDA graphs. num_splits overrides the split-KV plan (tests); by default it is chosen from the
    shapes (never from lengths, so a graph stays valid). variant picks the kernel: "mma" for BF16 pages;
    "mma4l" or "mma2_w2s2" for NVFP4 pages, or another occupancy configuration of theirs such as "mma4l_w1s2" or
    "mma2_w1s2" (warps, pipeline stages; codegen.ops.decode_attention); default: default_variant().
    """
    geom = validate(q, k_cache, v_cache, block_table, lengths, check_values=check_values)
    if q.dtype != torch.bfloat16:
        raise TypeError(f"q must be bfloat16, got {q.dtype}")
    if variant is not None:
        from trace_kernels.codegen.ops import decode_attention as codegen
        codegen.tiling("nvfp4" if geom.nvfp4 else "bf16", q.shape[1], geom.kv_heads, geom.head_dim, geom.page_size,
                       variant)  # unsupported shapes / variants raise here, before the op
    if geom.nvfp4:
        tensors = (k_cache.codes, v_cache.codes, k_cache.block_scales, v_cache.block_scales, k_cache.scale,
                   v_cache.scale)
    else:
        tensors = (k_cache.data, v_cache.data, None, None, None, None)
    return paged_decode_attention_op(q, *tensors, block_table, lengths, _default_scale(softmax_scale, geom.head_dim),
                                     int(num_splits or 0), variant or "")
