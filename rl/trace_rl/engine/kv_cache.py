"""Paged KV cache (BF16 or NVFP4 pages) and the paged attention backend the model calls.

Per layer, K and V each live in pages of P tokens (issue 5's layout):

- bf16:  ``data``          [pages, P, Hkv, D]     model dtype
- nvfp4: ``codes``         [pages, P, Hkv, D/2]   uint8, E2M1 codes in trace_kernels.kv_codes' layout
         ``block_scales``  [pages, P, Hkv, D/16]  float8_e4m3fn
         ``scale``         [pages, P, Hkv]        float32 (one per token and kv head)

A token at position t of a sequence lives in slot ``block_table[t // P] * P + t % P``.
In nvfp4 mode the K/V quantizer hands its ``NVFP4Tensor`` to ``write_quantized`` (the codes the
rollout chose are stored, never re-quantized); attention reads dequantized pages
(``dequantize_pages``: bit-identical to ``nvfp4.dequantize``, but its code table lives on the
device from the start, so it can run inside a captured CUDA graph; float8 bytes are moved as uint8).
Seam for the NVFP4 paged-attention kernels (trace_kernels.attention / kv_append): the page
tensors already have their layout; a kernel backend replaces ``PagedAttention``.
"""
from __future__ import annotations

import torch
from torch import Tensor

from trace_kernels import kv_codes, nvfp4
from trace_kernels.kv_gather import kv_gather
from trace_rl.model.layers import AttentionMask, masked_attention


_SIGNED_E2M1 = tuple(nvfp4.E2M1_MAGNITUDES) + tuple(-v for v in nvfp4.E2M1_MAGNITUDES)  # code 0..15


def code_table(device) -> Tensor:
    """FP32 [16]: the signed value of each 4-bit code (code 8 is -0.0, as nvfp4 decodes it)."""
    return torch.tensor(_SIGNED_E2M1, dtype=torch.float32, device=device)


def dequantize_pages(stored: Tensor, block_scales: Tensor, scale: Tensor, table: Tensor,
                     dtype: torch.dtype) -> Tensor:
    """stored uint8 [..., D/2] (the pages' code bytes, trace_kernels.kv_codes), block_scales e4m3
    [..., D/16], scale f32 [...] -> [..., D] in dtype: value(code) * (float(b) * s) in FP32, exactly
    nvfp4.dequantize (tested); no host work once kv_codes.prepare ran for the device."""
    codes = kv_codes.decode_codes(stored)
    c = torch.stack((codes & 0x0F, codes >> 4), dim=-1).reshape(*codes.shape[:-1], -1)  # [..., D]
    values = table[c.long()]  # [..., D] FP32
    step = block_scales.to(torch.float32) * scale.unsqueeze(-1)  # [..., D/16]
    blocks = values.reshape(*values.shape[:-1], -1, nvfp4.BLOCK_SIZE)  # [..., D/16, 16]
    return (blocks * step.unsqueeze(-1)).reshape(values.shape).to(dtype)


class KVPages:
    """One layer's K (or V) pages."""

    def __init__(self, num_blocks, block_size, num_kv_heads, head_dim, dtype, device, quantized):
        shape = (num_blocks, block_size, num_kv_heads)
        self.quantized, self.dtype = quantized, dtype
        if quantized:
            self.table = code_table(device)
            kv_codes.prepare(device)
            self.codes = torch.zeros(*shape, head_dim // 2, dtype=torch.uint8, device=device)
            self.block_scales = torch.zeros(*shape, head_dim // 16, dtype=torch.float8_e4m3fn,
                                            device=device)
            self.scale = torch.zeros(*shape, dtype=torch.float32, device=device)
        else:
            self.data = torch.zeros(*shape, head_dim, dtype=dtype, device=device)

    def _flat(self, t: Tensor) -> Tensor:  # [pages, P, ...] -> [pages * P, ...]
        return t.view(t.shape[0] * t.shape[1], *t.shape[2:])

    def write(self, slots: Tensor, x: Tensor) -> None:
        """slots int64 [N]; x [N, Hkv, D]."""
        self._flat(self.data).index_copy_(0, slots, x.to(self.dtype))

    def write_quantized(self, slots: Tensor, q: nvfp4.NVFP4Tensor) -> None:
        self._flat(self.codes).index_copy_(0, slots, kv_codes.encode_codes(q.codes))
        # index_copy_ has no float8 kernel everywhere; copy the bytes
        self._flat(self.block_scales).view(torch.uint8).index_copy_(0, slots, q.block_scales.view(torch.uint8))
        self._flat(self.scale).index_copy_(0, slots, q.scale)

    def gather(self, slot_table: Tensor) -> Tensor:
        """slot_table int64 [B, S] -> [B, S, Hkv, D] in the model dtype."""
        if not self.quantized:
            return self._flat(self.data)[slot_table]
        bscales = self._flat(self.block_scales).view(torch.uint8)[slot_table].view(torch.float8_e4m3fn)
        return dequantize_pages(self._flat(self.codes)[slot_table], bscales,
                                self._flat(self.scale)[slot_table], self.table, self.dtype)

    def nbytes(self) -> int:
        ts = (self.codes, self.block_scales, self.scale) if self.quantized else (self.data,)
        return sum(t.numel() * t.element_size() for t in ts)


class PagedKVCache:
    def __init__(self, num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, device,
                 quantized: bool):
        if quantized and head_dim % 16:
            raise ValueError(f"NVFP4 KV pages need head_dim % 16 == 0, got {head_dim}")
        self.block_size, self.quantized = block_size, quantized
        make = lambda: KVPages(num_blocks, block_size, num_kv_heads, head_dim, dtype, device, quantized)
        self.k = [make() for _ in range(num_layers)]
        self.v = [make() for _ in range(num_layers)]

    def nbytes(self) -> int:
        return sum(p.nbytes() for p in self.k + self.v)


class PagedAttention:
    """Attention backend for one engine step over a padded query batch [B, Tq].

    q_row, q_col int64 [N]: where each flat token sits in the query batch; slots int64 [N]: its
    cache slot; block_tables int64 [B, nblk] (padded with the scratch page 0); query_pos int64
    [B, Tq]: absolute position of each query (0 for padding). A query at position t attends to
    keys at positions 0..t of its own sequence. gather_kernel: NVFP4 pages on a CUDA device are
    dequantized by trace_kernels.kv_gather (one launch per layer, the same bits as ``KVPages.gather``).
    """

    def __init__(self, cache: PagedKVCache, slots, q_row, q_col, block_tables, query_pos, gather_kernel: bool = False):
        self.cache, self.slots, self.q_row, self.q_col = cache, slots, q_row, q_col
        P = cache.block_size
        B, nblk = block_tables.shape
        self.gather_kernel = gather_kernel and cache.quantized and block_tables.device.type == "cuda"
        if self.gather_kernel:  # every position of every table page (padding: the scratch page 0), as slot_table
            self.block_table = block_tables.to(torch.int32)  # [B, nblk]
            self.all_positions = torch.full((B,), nblk * P, dtype=torch.int32, device=block_tables.device)
        offs = torch.arange(P, device=block_tables.device)
        self.slot_table = (block_tables[:, :, None] * P + offs).reshape(B, nblk * P)  # [B, S]
        key_pos = torch.arange(nblk * P, device=block_tables.device)
        self.mask = AttentionMask(key_pos[None, None, :] <= query_pos[:, :, None])  # [B, Tq, S]
        self.B, self.Tq = B, query_pos.shape[1]

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if not self.cache.quantized:  # nvfp4 pages were written by the K/V quantizer
            self.cache.k[layer].write(self.slots, k)
            self.cache.v[layer].write(self.slots, v)
        if self.gather_kernel:
            keys, values = kv_gather(self.cache.k[layer], self.cache.v[layer], self.block_table, self.all_positions,
                                     dtype=self.cache.k[layer].dtype, check_values=False)  # [B, S, Hkv, D]
        else:
            keys = self.cache.k[layer].gather(self.slot_table)  # [B, S, Hkv, D]
            values = self.cache.v[layer].gather(self.slot_table)
        q_pad = q.new_zeros(self.B, self.Tq, *q.shape[1:])  # [B, Tq, Hq, D]
        q_pad[self.q_row, self.q_col] = q
        out = masked_attention(q_pad.transpose(1, 2), keys.transpose(1, 2).to(q.dtype),
                               values.transpose(1, 2).to(q.dtype), self.mask)
        return out.transpose(1, 2)[self.q_row, self.q_col]  # [N, Hq, D]
