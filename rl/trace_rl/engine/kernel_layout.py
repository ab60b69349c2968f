"""Host-side planning for the kernel-backed nvfp4 engine (pure torch, runs and is tested on CPU).

- ``kernel_support(config, dtype)``: why the fused kernels cannot run a model (None if they can).
- ``pack_gate_up_(dst, codes, block_scales, scale)``: natural per-expert NVFP4 of the model's
  ``w_gate_up`` [E, 2I, H] (gate rows, then up rows) -> the MoE GEMM's fragment-ordered layout
  with the gate/up rows interleaved, in one strided copy per tensor into preallocated buffers
  (= ``moe_layout.pack_weights(interleave_gate_up(gate, up))``, tested).
- ``kernel_routing(experts, weights, E)``: the GEMM's ``MoERouting`` without a host sync
  (= ``moe_routing.route``, which reads values back; tested).
- ``GuidanceLayout``: the byte layout of one token's guidance in a step's arena, uint8
  [N, bytes_per_token]. Kernels' guidance outputs are copied into it on the device (inside the
  captured decode graph), the arena goes to pinned host memory in one copy per step, and
  ``unpack`` cuts it back into per-(layer, site) rows for the ``GuidanceBatch``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from trace_kernels.moe_layout import CHUNK_K, TILE_ROWS, MoEWeights
from trace_kernels.moe_routing import MoERouting
from trace_rl.model.moe import sort_by_expert


def kernel_support(config, dtype: torch.dtype) -> str | None:
    """None when the NVFP4 kernels can run this model, else the reason they cannot."""
    c = config
    if dtype != torch.bfloat16:
        return f"the NVFP4 MoE GEMM takes BF16 activations; the engine runs in {dtype}"
    if c.hidden_size % CHUNK_K or c.moe_intermediate_size % CHUNK_K:
        return (f"the MoE GEMM weight layout needs hidden_size ({c.hidden_size}) and "
                f"moe_intermediate_size ({c.moe_intermediate_size}) to be multiples of {CHUNK_K}")
    if c.head_dim % 16:
        return f"NVFP4 K/V need head_dim % 16 == 0, got {c.head_dim}"
    if not c.moe_layers():
        return "the model has no MoE layer"
    return None


def kv_kernel_support(config, block_size: int, page_format: str = "nvfp4") -> str | None:
    """None when the paged-KV kernels (trace_kernels.kv_append, attention.decode_attention) take
    this model's attention shapes with pages ("nvfp4" | "bf16") of block_size tokens, else the reason."""
    try:
        from trace_kernels import attention
        from trace_kernels.codegen.ops import decode_attention as codegen
        variant = attention.DEFAULT_NVFP4_VARIANT if page_format == "nvfp4" else attention.DEFAULT_BF16_VARIANT
        codegen.tiling(page_format, config.num_attention_heads, config.num_key_value_heads, config.head_dim,
                       block_size, variant)
    except (ImportError, AttributeError, ValueError) as e:
        return f"paged-KV kernels unavailable: {e}"
    return None


def empty_moe_weights(experts: int, n: int, k: int, device) -> MoEWeights:
    """Zeroed packed weights [E, N, K] (allocated once; refit writes into them)."""
    t, c = n // TILE_ROWS, k // CHUNK_K
    return MoEWeights(
        codes=torch.zeros(experts, t, c, TILE_ROWS * CHUNK_K // 2, dtype=torch.uint8, device=device),
        block_scales=torch.zeros(experts, t, c, TILE_ROWS * CHUNK_K // 16, dtype=torch.float8_e4m3fn,
                                 device=device),
        scale=torch.zeros(experts, dtype=torch.float32, device=device))


def pack_gate_up_(dst: MoEWeights, codes: Tensor, block_scales: Tensor, scale: Tensor) -> MoEWeights:
    """Natural NVFP4 of w_gate_up (codes [E, 2I, H/2], block_scales [E, 2I, H/16], scale [E]; rows
    0..I-1 gate, I..2I-1 up) -> dst in the kernel layout, gate/up interleaved, in place.

    Interleaved row r' = 64t + 16w + 8h + g (tile t, warp w, half h, lane group g) holds natural
    row h*I + 32t + 8w + g (h = 0 gate, 1 up): the interleave folds into pack_weights_'s permutation.
    """
    e, n, half_k = codes.shape
    dst.validate(n=n, k=2 * half_k, name="dst")
    if dst.num_experts != e:
        raise ValueError(f"dst {dst.num_experts} experts x N={dst.n} does not fit codes {tuple(codes.shape)}")
    t, c = n // TILE_ROWS, 2 * half_k // CHUNK_K
    # source dims (e, h, t, w, g, c, j, kh, q) -> kernel record (e, t, c, w, g, q, j, kh, h)
    dst.codes.view(e, t, c, 4, 8, 4, 4, 2, 2).copy_(
        codes.reshape(e, 2, t, 4, 8, c, 4, 2, 4).permute(0, 2, 5, 3, 4, 8, 6, 7, 1))
    # source dims (e, h, t, w, g, c, j) -> (e, t, c, w, g, j, h)
    dst.block_scales.view(torch.uint8).view(e, t, c, 4, 8, 4, 2).copy_(
        block_scales.view(torch.uint8).reshape(e, 2, t, 4, 8, c, 4).permute(0, 2, 5, 3, 4, 6, 1))
    dst.scale.copy_(scale)
    return dst


def kernel_routing(experts: Tensor, weights: Tensor, num_experts: int) -> MoERouting:
    """experts int64 [N, k], router weights float32 [N, k] -> MoERouting (row_index int32 [M],
    offsets int32 [E+1], slot_rows int32 [N, k], row_weight float32 [M]); no device->host sync,
    so it can sit inside a captured decode graph."""
    N, k = experts.shape
    order, row_index, offsets = sort_by_expert(experts, num_experts)  # [M], [M], [E+1]
    M = order.numel()
    slot_rows = torch.empty(M, dtype=torch.int32, device=experts.device)  # flat slot -> sorted row
    slot_rows[order] = torch.arange(M, dtype=torch.int32, device=experts.device)
    return MoERouting(row_index=row_index.to(torch.int32), offsets=offsets,
                      slot_rows=slot_rows.view(N, k),
                      row_weight=weights.reshape(-1).index_select(0, order).to(torch.float32))


# ----------------------------------------------------------------------------- guidance arena

@dataclass(frozen=True)
class GuidanceField:
    layer: int
    site: str  # moe_in | moe_act | k | v
    name: str  # scale | block_scales | payload | experts
    dtype: torch.dtype
    shape: tuple[int, ...]  # per token: (*slots, *per-row shape)
    offset: int  # byte offset of the field's first byte in a token's arena row
    nbytes: int  # bytes per token
    stride: int  # bytes from one slot's piece of the field to the next (row-major slots)
    slots: int  # rows of this site per token (1 for moe_in)


_STORED_DTYPE = {"experts": torch.int16}  # experts < 2**15 (checked); widened to int64 on unpack
_ROW_FIELDS = ("scale", "block_scales", "payload")


class GuidanceLayout:
    """Byte layout of one token's guidance: every (layer, site) the trainer fake-quantizes.

    Per token: k and v of every layer ([Hkv] rows of D), moe_in ([] row of H) and moe_act ([k]
    rows of I, plus the slot experts) of every MoE layer. A site's rows are stored one after the
    other, each row as [FP32 scale | E4M3 block scales (D/16) | payload (mantissa bits D/8 bytes,
    or codes D/2 in full mode)], then (moe_act) the slot experts as int16: so ``put_rows`` writes
    a whole site with one concatenation and one copy (one more for a gather), which keeps the
    number of small kernels in a captured decode step low.
    """

    def __init__(self, config, mode: str):
        if mode not in ("compact", "full"):
            raise ValueError(f"guidance mode must be 'compact' or 'full', got {mode!r}")
        if config.num_experts > torch.iinfo(torch.int16).max:
            raise ValueError(f"{config.num_experts} experts do not fit the int16 expert ids")
        c, self.mode = config, mode
        self.per_byte = 8 if mode == "compact" else 2
        rows: list[tuple[int, str, tuple[int, ...], int]] = []  # layer, site, slot shape, D
        moe = set(c.moe_layers())
        for layer in range(c.num_hidden_layers):
            rows.append((layer, "k", (c.num_key_value_heads,), c.head_dim))
            rows.append((layer, "v", (c.num_key_value_heads,), c.head_dim))
            if layer in moe:
                rows.append((layer, "moe_in", (), c.hidden_size))
                rows.append((layer, "moe_act", (c.num_experts_per_tok,), c.moe_intermediate_size))
        self.fields: dict[tuple[int, str, str], GuidanceField] = {}
        self.sites: dict[tuple[int, str], tuple[int, int, int]] = {}  # offset, slots, row bytes
        offset = 0
        for layer, site, slots, d in rows:
            n_slots = _numel(slots)
            per_row = [("scale", torch.float32, ()), ("block_scales", torch.float8_e4m3fn, (d // 16,)),
                       ("payload", torch.uint8, (d // self.per_byte,))]
            row_bytes = sum(_numel(shape) * dtype.itemsize for _, dtype, shape in per_row)
            self.sites[(layer, site)] = (offset, n_slots, row_bytes)
            at = offset
            for name, dtype, shape in per_row:
                nb = _numel(shape) * dtype.itemsize
                self.fields[(layer, site, name)] = GuidanceField(layer, site, name, dtype, (*slots, *shape), at,
                                                                 nb * n_slots, row_bytes, n_slots)
                at += nb
            offset += n_slots * row_bytes
            if site == "moe_act":
                dtype = _STORED_DTYPE["experts"]
                self.fields[(layer, site, "experts")] = GuidanceField(
                    layer, site, "experts", dtype, slots, offset, n_slots * dtype.itemsize, dtype.itemsize, n_slots)
                offset += n_slots * dtype.itemsize
        self.tables = [(layer, site) for layer, site, _, _ in rows]
        self.bytes_per_token = offset

    def new_arena(self, tokens: int, device) -> Tensor:
        return torch.empty(tokens, self.bytes_per_token, dtype=torch.uint8, device=device)  # [N, B]

    def _field_view(self, arena: Tensor, f: GuidanceField) -> Tensor:
        """uint8 [N, slots, bytes per slot] view of one field in the arena."""
        piece = f.nbytes // f.slots
        rows = arena[:, f.offset:f.offset + (f.slots - 1) * f.stride + piece]
        return rows.as_strided((arena.shape[0], f.slots, piece), (arena.stride(0), f.stride, 1))

    def put(self, arena: Tensor, layer: int, site: str, name: str, value: Tensor) -> None:
        """Copy value [N, *shape] (the field's dtype; experts any integer) into the arena's columns."""
        f = self.fields[(layer, site, name)]
        N = arena.shape[0]
        if tuple(value.shape) != (N, *f.shape):
            raise ValueError(f"guidance {layer}/{site}/{name}: got {tuple(value.shape)}, expected {(N, *f.shape)}")
        if value.dtype != f.dtype:
            if name != "experts":
                raise TypeError(f"guidance {layer}/{site}/{name}: dtype {value.dtype}, expected {f.dtype}")
            value = value.to(f.dtype)
        self._field_view(arena, f).copy_(value.contiguous().view(torch.uint8).reshape(N, f.slots, -1))

    def put_rows(self, arena: Tensor, layer: int, site: str, scale: Tensor, block_scales: Tensor, payload: Tensor,
                 rows: Tensor | None = None) -> None:
        """A whole site at once. scale float32 [M, *S], block_scales e4m3 [M, *S, D/16], payload uint8
        [M, *S, D/p]; rows None: M = N tokens and S the site's slot shape; rows int64 [N, k]: the
        inputs are [M] sorted rows (S = ()) and slot j of token t is row rows[t, j]."""
        off, n_slots, row_bytes = self.sites[(layer, site)]
        N = arena.shape[0]
        packed = torch.cat((scale.contiguous().view(torch.uint8).reshape(*scale.shape, 4),
                            block_scales.view(torch.uint8), payload), dim=-1)  # [M, *S, row bytes]
        if packed.shape[-1] != row_bytes:
            raise ValueError(f"guidance {layer}/{site}: rows of {packed.shape[-1]} bytes, expected {row_bytes}")
        if rows is not None:
            packed = packed.index_select(0, rows.reshape(-1))  # [N * k, row bytes]
        if packed.numel() != N * n_slots * row_bytes:
            raise ValueError(f"guidance {layer}/{site}: {tuple(packed.shape)} does not fill {N} tokens x "
                             f"{n_slots} rows of {row_bytes} bytes")
        arena[:, off:off + n_slots * row_bytes].copy_(packed.reshape(N, n_slots * row_bytes))

    def unpack(self, arena: Tensor) -> dict[tuple[int, str], dict[str, Tensor]]:
        """Host arena uint8 [R, bytes_per_token] -> {(layer, site): {field: [R, *shape]}} (experts int64)."""
        if arena.dim() != 2 or arena.shape[1] != self.bytes_per_token or arena.dtype != torch.uint8:
            raise ValueError(f"arena must be uint8 [R, {self.bytes_per_token}], got {arena.dtype} {tuple(arena.shape)}")
        R = arena.shape[0]
        out: dict[tuple[int, str], dict[str, Tensor]] = {}
        for (layer, site, name), f in self.fields.items():
            raw = self._field_view(arena, f).contiguous()  # [R, slots, bytes per slot]
            v = raw.view(f.dtype).reshape(R, *f.shape)
            out.setdefault((layer, site), {})[name] = v.to(torch.int64) if name == "experts" else v
        return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
