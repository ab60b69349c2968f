"""Paged KV cache format (NVFP4 and BF16 pages) and its validation. docs/kv_cache.md has the details.

Per layer, K and V each live in pages of P tokens; a token of a sequence sits at slot
``block_table[b, t // P] * P + t % P`` (flat slot = page * P + offset):

  NVFP4  codes         uint8          [pages, P, Hkv, D/2]   E2M1 codes in 32-bit words of 8 (kv_codes)
         block_scales  float8_e4m3fn  [pages, P, Hkv, D/16]
         scale         float32        [pages, P, Hkv]        one per (token, kv head): batch-invariant
  BF16   data          bfloat16       [pages, P, Hkv, D]
  block_table int32 [B, max_pages]; lengths int32 [B]; slot_mapping int64 [T] for appends.

Each (token, kv head) row of D elements is quantized exactly as ``nvfp4.quantize(x, scale="row")``:
the scales are its bytes, the codes its codes in the layout decode attention reads fastest
(``kv_codes.encode_codes``; ``kv_codes.decode_codes`` gives nvfp4's nibbles back). Functions take any
object with these attributes (``codes/block_scales/scale`` or ``data``), so trace_rl's engine pages
(trace_rl.engine.kv_cache) plug in as they are.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from trace_kernels import kv_codes, nvfp4


@dataclass(frozen=True)
class NVFP4Pages:
    """One layer's K (or V) pages in NVFP4."""

    codes: torch.Tensor  # uint8 [pages, P, Hkv, D/2]
    block_scales: torch.Tensor  # float8_e4m3fn [pages, P, Hkv, D/16]
    scale: torch.Tensor  # float32 [pages, P, Hkv]


@dataclass(frozen=True)
class BF16Pages:
    """One layer's K (or V) pages in BF16."""

    data: torch.Tensor  # bfloat16 [pages, P, Hkv, D]


def allocate_nvfp4_pages(num_pages: int, page_size: int, kv_heads: int, head_dim: int,
                         device="cpu") -> NVFP4Pages:
    if head_dim <= 0 or head_dim % 16:
        raise ValueError(f"NVFP4 pages need head_dim a positive multiple of 16, got {head_dim}")
    shape = (num_pages, page_size, kv_heads)
    return NVFP4Pages(codes=torch.zeros(*shape, head_dim // 2, dtype=torch.uint8, device=device),
                      block_scales=torch.zeros(*shape, head_dim // 16, dtype=torch.float8_e4m3fn, device=device),
                      scale=torch.zeros(shape, dtype=torch.float32, device=device))


def allocate_bf16_pages(num_pages: int, page_size: int, kv_heads: int, head_dim: int, device="cpu") -> BF16Pages:
    return BF16Pages(torch.zeros(num_pages, page_size, kv_heads, head_dim, dtype=torch.bfloat16, device=device))


def is_nvfp4(pages) -> bool:
    return hasattr(pages, "codes") and getattr(pages, "codes") is not None


@dataclass(frozen=True)
class PageGeometry:
    num_pages: int
    page_size: int  # P
    kv_heads: int  # Hkv
    head_dim: int  # D
    nvfp4: bool

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def bytes_per_token_head(self) -> int:
        """Bytes one (token, kv head) row occupies in one of K or V."""
        d = self.head_dim
        return d // 2 + d // 16 + 4 if self.nvfp4 else 2 * d


def _tensor(pages, name: str) -> torch.Tensor:
    t = getattr(pages, name, None)
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"KV pages must have a tensor attribute {name!r} (got {type(pages).__name__})")
    return t


def page_geometry(pages, name: str = "k_cache") -> PageGeometry:
    """Check one page container's tensors against each other; returns its geometry."""
    if is_nvfp4(pages):
        codes, block_scales, scale = (_tensor(pages, n) for n in ("codes", "block_scales", "scale"))
        if codes.dtype != torch.uint8 or block_scales.dtype != torch.float8_e4m3fn or scale.dtype != torch.float32:
            raise TypeError(f"{name}: NVFP4 pages need codes uint8, block_scales float8_e4m3fn, scale float32; got "
                            f"{codes.dtype}, {block_scales.dtype}, {scale.dtype}")
        if codes.dim() != 4:
            raise ValueError(f"{name}.codes must be [pages, P, Hkv, D/2], got shape {tuple(codes.shape)}")
        n, p, h, half = codes.shape
        d = 2 * half
        if d % 16 or d == 0:
            raise ValueError(f"{name}: head_dim {d} must be a positive multiple of 16")
        if tuple(block_scales.shape) != (n, p, h, d // 16) or tuple(scale.shape) != (n, p, h):
            raise ValueError(f"{name}: block_scales {tuple(block_scales.shape)} / scale {tuple(scale.shape)} do not "
                             f"match codes {tuple(codes.shape)} (expected {(n, p, h, d // 16)} and {(n, p, h)})")
        for t, tn in ((block_scales, "block_scales"), (scale, "scale")):
            if t.device != codes.device:
                raise ValueError(f"{name}.{tn} is on {t.device} but {name}.codes is on {codes.device}")
        return PageGeometry(n, p, h, d, True)
    data = _tensor(pages, "data")
    if data.dtype != torch.bfloat16:
        raise TypeError(f"{name}.data must be bfloat16, got {data.dtype}")
    if data.dim() != 4:
        raise ValueError(f"{name}.data must be [pages, P, Hkv, D], got shape {tuple(data.shape)}")
    n, p, h, d = data.shape
    return PageGeometry(n, p, h, d, False)


def page_tensors(pages) -> tuple[torch.Tensor, ...]:
    if is_nvfp4(pages):
        return pages.codes, pages.block_scales, pages.scale
    return (pages.data,)


def cache_geometry(k_cache, v_cache) -> PageGeometry:
    gk, gv = page_geometry(k_cache, "k_cache"), page_geometry(v_cache, "v_cache")
    if gk != gv:
        raise ValueError(f"k_cache and v_cache differ: {gk} vs {gv}")
    device = page_tensors(k_cache)[0].device
    for t in page_tensors(v_cache):
        if t.device != device:
            raise ValueError(f"v_cache is on {t.device} but k_cache is on {device}")
    if gk.page_size <= 0 or gk.kv_heads <= 0 or gk.num_pages <= 0:
        raise ValueError(f"empty KV cache geometry {gk}")
    return gk


def cache_device(k_cache) -> torch.device:
    return page_tensors(k_cache)[0].device


class _Nvfp4PagePtrs(ctypes.Structure):  # trace_kernels::Nvfp4PagePtrs (kv_pages.cuh)
    _fields_ = [("codes", ctypes.c_void_p), ("block_scales", ctypes.c_void_p), ("scale", ctypes.c_void_p)]


def nvfp4_page_arg(pages):
    """One NVFP4 page set as the kernels take it: an Nvfp4PagePtrs passed by value (a runtime kernel argument)."""
    from trace_kernels.runtime.kernel import struct
    return struct(_Nvfp4PagePtrs(pages.codes.data_ptr(), pages.block_scales.data_ptr(), pages.scale.data_ptr()))


# ----------------------------------------------------------------------------------------------
# Reading pages back (reference paths)
# ----------------------------------------------------------------------------------------------

def _flat(t: torch.Tensor) -> torch.Tensor:  # [pages, P, ...] -> [pages * P, ...]
    return t.reshape(t.shape[0] * t.shape[1], *t.shape[2:])


def gather_slots(pages, slots: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """Dequantized K or V at flat slots (int64 [...]) -> [..., Hkv, D] in dtype.

    NVFP4: value(code) * float(b) * s in FP32 (nvfp4.dequantize), then cast to dtype.
    """
    slots = slots.long()
    if is_nvfp4(pages):
        q = nvfp4.NVFP4Tensor(codes=kv_codes.decode_codes(_flat(pages.codes)[slots]),
                              block_scales=_flat(pages.block_scales)[slots], scale=_flat(pages.scale)[slots])
        return nvfp4.dequantize(q, dtype=torch.float32).to(dtype)
    return _flat(pages.data)[slots].to(dtype)


def slot_table(block_table: torch.Tensor, page_size: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """int64 [B, max_pages * P] flat slot of every position; positions >= length point at slot 0."""
    b, max_pages = block_table.shape
    offsets = torch.arange(page_size, device=block_table.device)
    slots = (block_table.long()[:, :, None] * page_size + offsets).reshape(b, max_pages * page_size)
    if lengths is not None:
        pos = torch.arange(max_pages * page_size, device=block_table.device)
        slots = torch.where(pos[None, :] < lengths.long()[:, None], slots, torch.zeros_like(slots))
    return slots


# ----------------------------------------------------------------------------------------------
# Validation shared by append and attention (before any launch)
# ----------------------------------------------------------------------------------------------

def check_block_table(block_table, lengths, geometry: PageGeometry, device, batch: int | None = None,
                      *, check_values: bool = True) -> None:
    """block_table int32 [B, max_pages], lengths int32 [B] on device; with check_values (one host
    sync) every length is in [1, max_pages * P] and every page a sequence uses is in [0, pages)."""
    for t, name in ((block_table, "block_table"), (lengths, "lengths")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.int32:
            raise TypeError(f"{name} must be int32, got {t.dtype}")
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but the KV cache is on {device}")
    if block_table.dim() != 2 or block_table.shape[1] == 0:
        raise ValueError(f"block_table must be [B, max_pages] with max_pages >= 1, got {tuple(block_table.shape)}")
    b = block_table.shape[0]
    if batch is not None and b != batch:
        raise ValueError(f"block_table has {b} rows but the batch has {batch} sequences")
    if tuple(lengths.shape) != (b,):
        raise ValueError(f"lengths must be [B] = [{b}], got {tuple(lengths.shape)}")
    if not check_values or b == 0:
        return
    capacity = block_table.shape[1] * geometry.page_size
    lens = lengths.long().cpu()
    bad = ((lens < 1) | (lens > capacity)).nonzero()
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"lengths[{i}] = {int(lens[i])} is outside [1, {capacity}] (block_table has "
                         f"{block_table.shape[1]} pages of {geometry.page_size} tokens); {len(bad)} bad length(s)")
    used = torch.arange(block_table.shape[1])[None, :] < (-(-lens // geometry.page_size))[:, None]  # [B, max_pages]
    table = block_table.cpu().long()
    bad_page = used & ((table < 0) | (table >= geometry.num_pages))
    if bad_page.any():
        i, j = (int(v) for v in bad_page.nonzero()[0])
        raise ValueError(f"block_table[{i}, {j}] = {int(table[i, j])} is not a page of the cache "
                         f"(0..{geometry.num_pages - 1}) but sequence {i} (length {int(lens[i])}) uses it")
