"""`kv_gather`: a layer's paged K/V -> contiguous dequantized K and V, for prefill / extend attention.

    keys, values = kv_gather(k_pages, v_pages, block_table, lengths)   # [B, S, Hkv, D] bf16 each

Position t < lengths[b] of sequence b is its cache row dequantized exactly as ``nvfp4.dequantize``
computes it (value(code) * float(b) * s in FP32, then one rounding to the output dtype): the values
decode attention computes with, so a prefill over the gathered K/V and the later decode read the same
keys and values. Positions at or past the length are zero and their block-table entries are not read.
NVFP4 pages on the GPU: one launch for K and V (cuda/include/trace_kernels/kv_gather.cuh). BF16 pages
and CPU tensors: the reference below (BF16 pages are a plain indexing gather).
"""

from __future__ import annotations

import torch

from trace_kernels import kv_cache, nvtx

OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


# ----------------------------------------------------------------------------------------------
# Validation (before any launch)
# ----------------------------------------------------------------------------------------------

def validate(k_cache, v_cache, block_table, lengths, positions: int | None, dtype: torch.dtype, *,
             check_values: bool) -> tuple[kv_cache.PageGeometry, int]:
    """-> (geometry, positions); raises on anything the kernel could not take."""
    geom = kv_cache.cache_geometry(k_cache, v_cache)
    device = kv_cache.cache_device(k_cache)
    if dtype not in OUT_DTYPES:
        raise TypeError(f"kv_gather: dtype must be one of {OUT_DTYPES}, got {dtype}")
    kv_cache.check_block_table(block_table, lengths, geom, device, check_values=check_values)
    capacity = block_table.shape[1] * geom.page_size
    positions = capacity if positions is None else positions
    if not isinstance(positions, int) or isinstance(positions, bool) or not 1 <= positions <= capacity:
        raise ValueError(f"kv_gather: positions must be an int in [1, {capacity}] (max_pages x page size), "
                         f"got {positions!r}")
    if block_table.shape[0] * positions >= 2**31:
        raise ValueError(f"kv_gather: {block_table.shape[0]} sequences x {positions} positions exceed int32 "
                         "indexing; gather fewer sequences at once")
    if device.type == "cuda":
        from trace_kernels.ops._common import check_cuda_device, check_tensor
        check_cuda_device(block_table)
        for t, name in ((block_table, "block_table"), (lengths, "lengths")):
            check_tensor(t, name, aligned=False)
        for pages, prefix in ((k_cache, "k_cache"), (v_cache, "v_cache")):
            for t in kv_cache.page_tensors(pages):
                check_tensor(t, prefix)
    return geom, positions


# ----------------------------------------------------------------------------------------------
# Reference
# ----------------------------------------------------------------------------------------------

def kv_gather_reference(k_cache, v_cache, block_table, lengths, positions: int,
                        dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_cache.gather_slots of every position < positions in dtype; positions >= length zero."""
    geom = kv_cache.cache_geometry(k_cache, v_cache)
    slots = kv_cache.slot_table(block_table, geom.page_size, lengths)[:, :positions]  # [B, S]; past the end: 0
    pos = torch.arange(positions, device=block_table.device)
    valid = (pos[None, :] < lengths.long()[:, None])[:, :, None, None]  # [B, S, 1, 1]
    return tuple(torch.where(valid, kv_cache.gather_slots(pages, slots, dtype), 0).to(dtype)
                 for pages in (k_cache, v_cache))


# ----------------------------------------------------------------------------------------------
# GPU launch
# ----------------------------------------------------------------------------------------------

def _launch(k_cache, v_cache, block_table, lengths, geom: kv_cache.PageGeometry, positions: int,
            dtype: torch.dtype, items: int) -> tuple[torch.Tensor, torch.Tensor]:
    from trace_kernels.codegen.ops import kv_gather as codegen
    from trace_kernels.ops._common import check_cuda_device, new_output
    from trace_kernels.runtime import i32, i64, kernel_for, ptr
    device = check_cuda_device(block_table)
    b = block_table.shape[0]
    shape = (b, positions, geom.kv_heads, geom.head_dim)
    keys, values = (new_output(shape, dtype, block_table.device) for _ in range(2))
    blocks = b * positions * geom.kv_heads * (geom.head_dim // 16)
    if blocks:
        spec = codegen.spec(dtype, geom.kv_heads, geom.head_dim, items)
        args = [kv_cache.nvfp4_page_arg(k_cache), kv_cache.nvfp4_page_arg(v_cache), ptr(block_table), ptr(lengths), i32(block_table.shape[1]), i32(geom.page_size),
                i32(positions), i64(blocks), ptr(keys), ptr(values)]
        grid = (-(-blocks // spec.launch["blocks_per_cta"]), 2)
        with nvtx.annotate("kv_gather"):
            kernel_for(spec).launch(device, grid, (spec.launch["threads"],), args)
    return keys, values


@torch.library.custom_op("trace_kernels::kv_gather_nvfp4", mutates_args=())
def kv_gather_nvfp4_op(k_codes: torch.Tensor, k_block_scales: torch.Tensor, k_scale: torch.Tensor,
                       v_codes: torch.Tensor, v_block_scales: torch.Tensor, v_scale: torch.Tensor,
                       block_table: torch.Tensor, lengths: torch.Tensor, positions: int, dtype: torch.dtype,
                       items: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Validated gather of NVFP4 pages; items = 16-element blocks per thread of the kernel."""
    k_cache = kv_cache.NVFP4Pages(k_codes, k_block_scales, k_scale)
    v_cache = kv_cache.NVFP4Pages(v_codes, v_block_scales, v_scale)
    if block_table.device.type == "cpu":
        return kv_gather_reference(k_cache, v_cache, block_table, lengths, positions, dtype)
    return _launch(k_cache, v_cache, block_table, lengths, kv_cache.cache_geometry(k_cache, v_cache), positions,
                   dtype, items)


@kv_gather_nvfp4_op.register_fake
def _(k_codes, k_block_scales, k_scale, v_codes, v_block_scales, v_scale, block_table, lengths, positions, dtype,
      items):
    shape = (block_table.shape[0], positions, k_codes.shape[2], 2 * k_codes.shape[3])
    return k_codes.new_empty(shape, dtype=dtype), k_codes.new_empty(shape, dtype=dtype)


def kv_gather(k_cache, v_cache, block_table: torch.Tensor, lengths: torch.Tensor, positions: int | None = None,
              dtype: torch.dtype = torch.bfloat16, *, check_values: bool = True, items: int | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of positions 0 .. positions - 1 of every sequence, dequantized: two [B, positions, Hkv, D] in dtype
    (bfloat16, float16 or float32); positions default max_pages * P, positions >= lengths[b] are zero.

    block_table int32 [B, max_pages], lengths int32 [B] as for decode_attention. check_values=True reads
    lengths and block table on the host (one sync) and raises on lengths outside [1, max_pages * P] or pages
    a sequence uses outside the cache; pass False inside CUDA graphs once the caller guarantees them.
    items: 16-element blocks per kernel thread (codegen.ops.kv_gather.ITEM_CHOICES; default ITEMS).
    """
    from trace_kernels.codegen.ops import kv_gather as codegen
    geom, positions = validate(k_cache, v_cache, block_table, lengths, positions, dtype, check_values=check_values)
    items = codegen.check_items(codegen.ITEMS if items is None else items)
    if not geom.nvfp4:
        return kv_gather_reference(k_cache, v_cache, block_table, lengths, positions, dtype)
    return kv_gather_nvfp4_op(k_cache.codes, k_cache.block_scales, k_cache.scale, v_cache.codes, v_cache.block_scales,
                              v_cache.scale, block_table, lengths, positions, dtype, items)
