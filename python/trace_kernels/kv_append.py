"""`kv_append`: write K and V rows into the paged cache through a slot mapping.

    g = kv_append(k, v, slot_mapping, k_pages, v_pages, guidance=True)   # k, v bf16 [T, Hkv, D]
    g.k, g.v                                                             # nvfp4.Guidance (compact)

NVFP4 pages: each (token, kv head) row is quantized exactly as ``nvfp4.quantize(x, scale="row")``
and its bytes are written at ``slot_mapping[t]``; with guidance=True the compact TRACE guidance of
what was written comes back in token order, equal to ``nvfp4.make_guidance(nvfp4.quantize(k))``.
BF16 pages: a scatter copy. GPU: one launch for K and V (cuda/include/trace_kernels/kv_append.cuh);
CPU: the reference below. docs/kv_cache.md describes the format and the checks.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from trace_kernels import kv_cache, kv_codes, nvfp4, nvtx


@dataclass(frozen=True)
class KVGuidance:
    k: nvfp4.Guidance  # scale [T, Hkv], block_scales [T, Hkv, D/16], mantissa_bits [T, Hkv, D/8]
    v: nvfp4.Guidance


# ----------------------------------------------------------------------------------------------
# Validation (before any launch)
# ----------------------------------------------------------------------------------------------

def validate(k, v, slot_mapping, k_cache, v_cache, *, guidance: bool, check_values: bool) -> kv_cache.PageGeometry:
    geom = kv_cache.cache_geometry(k_cache, v_cache)
    device = kv_cache.cache_device(k_cache)
    expected = (geom.kv_heads, geom.head_dim)
    for x, name in ((k, "k"), (v, "v")):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype != torch.bfloat16:
            raise TypeError(f"{name} must be bfloat16 (K/V after RoPE), got {x.dtype}")
        if x.dim() != 3 or tuple(x.shape[1:]) != expected:
            raise ValueError(f"{name} must be [T, Hkv, D] = [T, {expected[0]}, {expected[1]}], got {tuple(x.shape)}")
        if x.device != device:
            raise ValueError(f"{name} is on {x.device} but the KV cache is on {device}")
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} differ in shape")
    if not isinstance(slot_mapping, torch.Tensor):
        raise TypeError(f"slot_mapping must be a torch.Tensor, got {type(slot_mapping).__name__}")
    if slot_mapping.dtype != torch.int64:
        raise TypeError(f"slot_mapping must be int64 (flat slot = page * P + offset), got {slot_mapping.dtype}")
    if tuple(slot_mapping.shape) != (k.shape[0],):
        raise ValueError(f"slot_mapping must be [T] = [{k.shape[0]}], got {tuple(slot_mapping.shape)}")
    if slot_mapping.device != device:
        raise ValueError(f"slot_mapping is on {slot_mapping.device} but the KV cache is on {device}")
    if guidance and not geom.nvfp4:
        raise ValueError("guidance=True needs NVFP4 pages (BF16 pages quantize nothing)")
    if k.shape[0] * geom.kv_heads >= 2**31:
        raise ValueError(f"{k.shape[0]} tokens x {geom.kv_heads} heads exceed int32 row indexing; split the append")
    if device.type == "cuda":
        from trace_kernels.ops._common import check_cuda_device, check_tensor
        check_cuda_device(k)
        for t, name in ((k, "k"), (v, "v"), (slot_mapping, "slot_mapping")):
            check_tensor(t, name)
        for pages, prefix in ((k_cache, "k_cache"), (v_cache, "v_cache")):
            for t in kv_cache.page_tensors(pages):
                check_tensor(t, prefix)
    if check_values and k.shape[0]:
        slots = slot_mapping.cpu()
        bad = ((slots < 0) | (slots >= geom.num_slots)).nonzero()
        if len(bad):
            i = int(bad[0])
            raise ValueError(f"slot_mapping[{i}] = {int(slots[i])} is outside the cache's slots 0..{geom.num_slots - 1} "
                             f"({geom.num_pages} pages x {geom.page_size}); {len(bad)} bad slot(s)")
        if len(torch.unique(slots)) != len(slots):
            raise ValueError("slot_mapping has repeated slots: two tokens would race for one cache row")
        if geom.nvfp4:
            nvfp4.check_finite(k, "k")
            nvfp4.check_finite(v, "v")
    return geom


# ----------------------------------------------------------------------------------------------
# Reference
# ----------------------------------------------------------------------------------------------

def _flat(t: torch.Tensor) -> torch.Tensor:  # [pages, P, Hkv, ...] -> [slots, Hkv, ...] (a view)
    return t.view(t.shape[0] * t.shape[1], *t.shape[2:])


def kv_append_reference(k, v, slot_mapping, k_cache, v_cache, *, guidance: bool = False) -> KVGuidance | None:
    """nvfp4.quantize(x, scale="row") per (token, kv head), bytes written at the slots."""
    out = []
    for x, pages in ((k, k_cache), (v, v_cache)):
        if kv_cache.is_nvfp4(pages):
            q = nvfp4.quantize(x, scale="row")  # codes [T, Hkv, D/2], block_scales [T, Hkv, D/16], scale [T, Hkv]
            _flat(pages.codes).index_copy_(0, slot_mapping, kv_codes.encode_codes(q.codes))
            # index_copy_ has no float8 kernel everywhere: copy the bytes
            _flat(pages.block_scales).view(torch.uint8).index_copy_(0, slot_mapping, q.block_scales.view(torch.uint8))
            _flat(pages.scale).index_copy_(0, slot_mapping, q.scale)
            out.append(nvfp4.make_guidance(q, "compact") if guidance else None)
        else:
            _flat(pages.data).index_copy_(0, slot_mapping, x.to(torch.bfloat16))
    return KVGuidance(*out) if guidance else None


# ----------------------------------------------------------------------------------------------
# GPU launch
# ----------------------------------------------------------------------------------------------

# NVFP4 append kernel: "b1" (one block per thread), "b2" (two) or "b4" (four), optionally "_cta128" (threads
# per CTA) and "_mb12" (CTAs per SM the registers must allow); codegen/ops/kv_append.py. b2 in 128-thread
# CTAs: never slower than b2's 256 in three same-run A/Bs on the H200, 3-5% faster at 64K tokens
# (profiling/results/kv_append_h200.json, kv_append_pipelined_h200.json, docs/kv_cache.md)
DEFAULT_NVFP4_VARIANT = "b2_cta128"


def default_nvfp4_variant(head_dim: int) -> str:
    """DEFAULT_NVFP4_VARIANT, or b1 where a row has too few 16-element blocks for it (head_dim 16: one block)."""
    from trace_kernels.codegen.ops import kv_append as codegen
    blocks = codegen.VARIANTS[DEFAULT_NVFP4_VARIANT.split("_")[0]]
    return DEFAULT_NVFP4_VARIANT if (head_dim // 16) % blocks == 0 else "b1"


class _GuidancePtrs(ctypes.Structure):  # trace_kernels::GuidancePtrs
    _fields_ = [("scale", ctypes.c_void_p), ("block_scales", ctypes.c_void_p), ("mantissa_bits", ctypes.c_void_p)]


def kernel_spec(nvfp4_pages: bool, kv_heads: int, head_dim: int, variant: str = ""):
    """The kernel an append launches: NVFP4 pages take `variant` ("" = default_nvfp4_variant), BF16
    pages their one kernel (the NVFP4 default must not leak into them)."""
    from trace_kernels.codegen.ops import kv_append as codegen
    if not nvfp4_pages:
        return codegen.spec("bf16", kv_heads, head_dim, variant or "b1")
    return codegen.spec("nvfp4", kv_heads, head_dim, variant or default_nvfp4_variant(head_dim))


def _launch(k, v, slot_mapping, k_cache, v_cache, geom: kv_cache.PageGeometry, guidance: bool,
            variant: str = "") -> KVGuidance | None:
    from trace_kernels.ops._common import check_cuda_device, new_output, status_buffer
    from trace_kernels.runtime import i32, i64, kernel_for, ptr, struct
    device = check_cuda_device(k)
    tokens, hkv, d = k.shape
    guides = []
    if guidance:
        for _ in range(2):
            guides.append(nvfp4.Guidance(scale=new_output((tokens, hkv), torch.float32, k.device),
                                         block_scales=new_output((tokens, hkv, d // 16), torch.float8_e4m3fn, k.device),
                                         mantissa_bits=new_output((tokens, hkv, d // 8), torch.uint8, k.device)))
    if tokens:
        spec = kernel_spec(geom.nvfp4, hkv, d, variant)
        grid = (-(-tokens * hkv // spec.launch["rows_per_cta"]), 2)
        if geom.nvfp4:
            pages = [kv_cache.nvfp4_page_arg(c) for c in (k_cache, v_cache)]
            guide_ptrs = [struct(_GuidancePtrs(g.scale.data_ptr(), g.block_scales.data_ptr(), g.mantissa_bits.data_ptr())
                                    if guidance else _GuidancePtrs(0, 0, 0)) for g in (guides or [None, None])]
            args = [ptr(k), ptr(v), ptr(slot_mapping), *pages, *guide_ptrs, i32(tokens), i64(geom.num_slots),
                    ptr(status_buffer(device))]
        else:
            args = [ptr(k), ptr(v), ptr(slot_mapping), ptr(k_cache.data), ptr(v_cache.data), i32(tokens),
                    i64(geom.num_slots)]
        with nvtx.annotate("kv_append"):
            kernel_for(spec).launch(device, grid, (spec.launch["threads"],), args)
    return KVGuidance(*guides) if guidance else None


_EMPTY = (0,)
_NVFP4_PAGES = ("k_codes", "k_block_scales", "k_scale", "v_codes", "v_block_scales", "v_scale")


@torch.library.custom_op("trace_kernels::kv_append_nvfp4", mutates_args=_NVFP4_PAGES)
def kv_append_nvfp4_op(k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor, k_codes: torch.Tensor,
                       k_block_scales: torch.Tensor, k_scale: torch.Tensor, v_codes: torch.Tensor,
                       v_block_scales: torch.Tensor, v_scale: torch.Tensor, emit_guidance: bool, variant: str = ""
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validated append into NVFP4 pages; returns the K then V guidance (scale, block_scales,
    mantissa_bits), or six empty tensors without emit_guidance. variant "" = default_nvfp4_variant(D)."""
    k_cache = kv_cache.NVFP4Pages(k_codes, k_block_scales, k_scale)
    v_cache = kv_cache.NVFP4Pages(v_codes, v_block_scales, v_scale)
    if k.device.type == "cpu":
        g = kv_append_reference(k, v, slot_mapping, k_cache, v_cache, guidance=emit_guidance)
    else:
        g = _launch(k, v, slot_mapping, k_cache, v_cache, kv_cache.cache_geometry(k_cache, v_cache), emit_guidance,
                    variant)
    if g is None:
        return tuple(k.new_empty(_EMPTY, dtype=dt) for dt in (torch.float32, torch.float8_e4m3fn, torch.uint8) * 2)
    return tuple(t for guide in (g.k, g.v) for t in (guide.scale, guide.block_scales, guide.mantissa_bits))


@kv_append_nvfp4_op.register_fake
def _(k, v, slot_mapping, k_codes, k_block_scales, k_scale, v_codes, v_block_scales, v_scale, emit_guidance,
      variant=""):
    t, h, d = k.shape
    shapes = ((t, h), (t, h, d // 16), (t, h, d // 8)) if emit_guidance else (_EMPTY,) * 3
    return tuple(k.new_empty(s, dtype=dt) for _ in range(2)
                 for s, dt in zip(shapes, (torch.float32, torch.float8_e4m3fn, torch.uint8)))


@torch.library.custom_op("trace_kernels::kv_append_bf16", mutates_args=("k_data", "v_data"))
def kv_append_bf16_op(k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor, k_data: torch.Tensor,
                      v_data: torch.Tensor) -> None:
    """Validated scatter copy into BF16 pages."""
    k_cache, v_cache = kv_cache.BF16Pages(k_data), kv_cache.BF16Pages(v_data)
    if k.device.type == "cpu":
        kv_append_reference(k, v, slot_mapping, k_cache, v_cache)
    else:
        _launch(k, v, slot_mapping, k_cache, v_cache, kv_cache.cache_geometry(k_cache, v_cache), False)


@kv_append_bf16_op.register_fake
def _(k, v, slot_mapping, k_data, v_data):
    return None


def kv_append(k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor, k_cache, v_cache, *,
              guidance: bool = False, check_values: bool = True, variant: str | None = None) -> KVGuidance | None:
    """Append K/V rows (bf16 [T, Hkv, D]) at slot_mapping (int64 [T]) into k_cache / v_cache.

    Pages are NVFP4Pages / BF16Pages (or any object with the same tensor attributes, e.g. the
    rollout engine's). check_values=True reads the slots and K/V on the host (one sync) and raises
    on slots outside the cache, repeated slots or NaN/Inf; pass False inside CUDA graphs once the
    caller guarantees them (the kernel still never writes outside the cache, and flags NaN/Inf in
    the status word read by trace_kernels.ops.raise_on_nonfinite, leaving those rows unwritten).
    variant picks the NVFP4 kernel ("b1": one 16-element block per thread, "b2": two, "b4": four;
    "_cta128" sets the threads per CTA, "_mb12" the CTAs per SM its registers must allow; default
    DEFAULT_NVFP4_VARIANT, b1 at head_dim 16); BF16 pages have one kernel.
    """
    geom = validate(k, v, slot_mapping, k_cache, v_cache, guidance=guidance, check_values=check_values)
    if variant is not None:
        kernel_spec(geom.nvfp4, k.shape[1], k.shape[2], variant)  # unknown variants raise here
    if not geom.nvfp4:
        kv_append_bf16_op(k, v, slot_mapping, k_cache.data, v_cache.data)
        return None
    out = kv_append_nvfp4_op(k, v, slot_mapping, k_cache.codes, k_cache.block_scales, k_cache.scale, v_cache.codes,
                             v_cache.block_scales, v_cache.scale, guidance, variant or "")
    if not guidance:
        return None
    return KVGuidance(nvfp4.Guidance(scale=out[0], block_scales=out[1], mantissa_bits=out[2]),
                      nvfp4.Guidance(scale=out[3], block_scales=out[4], mantissa_bits=out[5]))
