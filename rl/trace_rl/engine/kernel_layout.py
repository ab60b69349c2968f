"""Host-side planning for the kernel-backed nvfp4 engine (pure torch, runs and is tested on CPU).

- ``kernel_support(config, dtype)``: why the fused kernels cannot run a model (None if they can).
- ``kernel_routing(experts, weights, E)``: the GEMM's ``MoERouting`` without a host sync
  (= ``moe_routing.route``, which reads values back; tested).
- ``GuidanceLayout``: the byte layout of one token's guidance in a step's arena, uint8
  [N, bytes_per_token]. Kernels' guidance outputs are copied into it on the device (inside the
  captured decode graph) with one concatenation (``GuidanceParts``), the arena goes to pinned host
  memory in pieces, and ``unpack`` views the (sorted) rows as per-(layer, site) fields for the
  ``GuidanceBatch`` without copying them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from trace_kernels.moe_layout import CHUNK_K, empty_weights
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
        variant = attention.default_variant(page_format, config.num_attention_heads, config.num_key_value_heads,
                                            config.head_dim, block_size)
        codegen.tiling(page_format, config.num_attention_heads, config.num_key_value_heads, config.head_dim,
                       block_size, variant)
    except (ImportError, AttributeError, ValueError) as e:
        return f"paged-KV kernels unavailable: {e}"
    return None


empty_moe_weights = empty_weights  # zeroed packed weights [E, N, K] (allocated once; refit writes into them)


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
    offset: int  # byte offset of the field's first byte in a token's arena row (aligned to its dtype)
    nbytes: int  # bytes per token, contiguous (all slots)


@dataclass(frozen=True)
class GuidanceSite:
    slots: int  # rows of this site per token (1 for moe_in)
    d: int  # elements per row


_STORED_DTYPE = {"experts": torch.int16}  # experts < 2**15 (checked); widened to int64 on unpack
_ROW_FIELDS = ("scale", "block_scales", "payload")


class GuidanceLayout:
    """Byte layout of one token's guidance: every (layer, site) the trainer fake-quantizes.

    Per token: k and v of every layer ([Hkv] rows of D), moe_in ([] row of H) and moe_act ([k]
    rows of I, plus the slot experts) of every MoE layer. Each field is contiguous over its site's
    slots, and fields are ordered by element size: every FP32 scale field first, then the int16 slot
    experts, then the E4M3 block scales and payloads (mantissa bits D/8 or codes D/2 per row) site
    after site. So every field is aligned without padding and, for a batch of rows, is a dtype view
    of them (``unpack`` copies nothing but the experts); and a step builds its whole arena with one
    concatenation (``GuidanceParts``): few small kernels in a captured decode step. (Rows stored
    slot by slot, [scale | block scales | payload], had to be regrouped byte by byte on the host:
    with the sort, 2.3-2.5 s for the 4.7 GB of a batch on the H200's host, longer than its decode.)
    """

    def __init__(self, config, mode: str):
        if mode not in ("compact", "full"):
            raise ValueError(f"guidance mode must be 'compact' or 'full', got {mode!r}")
        if config.num_experts > torch.iinfo(torch.int16).max:
            raise ValueError(f"{config.num_experts} experts do not fit the int16 expert ids")
        c, self.mode = config, mode
        self.per_byte = 8 if mode == "compact" else 2
        self.sites: dict[tuple[int, str], GuidanceSite] = {}
        moe = set(c.moe_layers())
        for layer in range(c.num_hidden_layers):
            self.sites[(layer, "k")] = GuidanceSite(c.num_key_value_heads, c.head_dim)
            self.sites[(layer, "v")] = GuidanceSite(c.num_key_value_heads, c.head_dim)
            if layer in moe:
                self.sites[(layer, "moe_in")] = GuidanceSite(1, c.hidden_size)
                self.sites[(layer, "moe_act")] = GuidanceSite(c.num_experts_per_tok, c.moe_intermediate_size)
        self.tables = list(self.sites)
        specs = []  # (layer, site, name, dtype, per-token shape)
        for (layer, site), st in self.sites.items():
            slots = () if site == "moe_in" else (st.slots,)
            specs += [(layer, site, "scale", torch.float32, slots),
                      (layer, site, "block_scales", torch.float8_e4m3fn, (*slots, st.d // 16)),
                      (layer, site, "payload", torch.uint8, (*slots, st.d // self.per_byte))]
            if site == "moe_act":
                specs.append((layer, site, "experts", _STORED_DTYPE["experts"], slots))
        specs.sort(key=lambda f: -f[3].itemsize)  # stable: widest dtypes first, then site order
        self.fields: dict[tuple[int, str, str], GuidanceField] = {}
        offset = 0
        for layer, site, name, dtype, shape in specs:
            nbytes = _numel(shape) * dtype.itemsize
            self.fields[(layer, site, name)] = GuidanceField(layer, site, name, dtype, shape, offset, nbytes)
            offset += nbytes
        self.bytes_per_token = offset

    def collector(self) -> "GuidanceParts":
        return GuidanceParts(self)

    def unpack(self, arena: Tensor) -> dict[tuple[int, str], dict[str, Tensor]]:
        """Arena rows uint8 [R, bytes_per_token] -> {(layer, site): {field: [R, *shape]}}: views of
        the rows (no copy), except experts (widened to int64)."""
        if arena.dim() != 2 or arena.shape[1] != self.bytes_per_token or arena.dtype != torch.uint8:
            raise ValueError(f"arena must be uint8 [R, {self.bytes_per_token}], got {arena.dtype} {tuple(arena.shape)}")
        R = arena.shape[0]
        out: dict[tuple[int, str], dict[str, Tensor]] = {}
        for (layer, site, name), f in self.fields.items():
            v = arena[:, f.offset:f.offset + f.nbytes].view(f.dtype).view(R, *f.shape)
            out.setdefault((layer, site), {})[name] = v.to(torch.int64) if name == "experts" else v
        return out


class GuidanceParts:
    """One step's guidance, site by site as the kernels produce it, then ``assemble``d into the
    step's arena uint8 [N, bytes_per_token] with one concatenation."""

    def __init__(self, layout: GuidanceLayout):
        self.layout = layout
        self.parts: dict[tuple[int, str, str], Tensor] = {}  # field -> uint8 [N, nbytes]
        self.tokens: int | None = None

    def _put(self, layer: int, site: str, name: str, value: Tensor) -> None:
        """value: the field's dtype, [N, *shape] elements in (token, slot, ...) order."""
        f = self.layout.fields[(layer, site, name)]
        if value.dtype != f.dtype or value.dim() != 1 + len(f.shape) or tuple(value.shape[1:]) != f.shape:
            raise ValueError(f"guidance {layer}/{site}/{name}: {value.dtype} {tuple(value.shape)}, expected "
                             f"{f.dtype} [N, {', '.join(map(str, f.shape))}]")
        n = value.shape[0]
        if self.tokens is None:
            self.tokens = n
        elif n != self.tokens:
            raise ValueError(f"guidance {layer}/{site}/{name}: {n} tokens, the step has {self.tokens}")
        self.parts[(layer, site, name)] = value.contiguous().view(torch.uint8).view(n, f.nbytes)

    def add_rows(self, layer: int, site: str, scale: Tensor, block_scales: Tensor, payload: Tensor,
                 rows: Tensor | None = None) -> None:
        """A site's rows: scale float32 [N, *S], block_scales e4m3 [N, *S, D/16], payload uint8
        [N, *S, D/p]; or, with rows int64 [N, k], [M] sorted rows (S = ()) of which slot j of
        token t is row rows[t, j] (gathered here, one gather per field)."""
        for name, value in zip(_ROW_FIELDS, (scale, block_scales, payload)):
            if rows is not None:  # [M, ...] -> [N, k, ...]
                value = value.index_select(0, rows.reshape(-1)).view(*rows.shape, *value.shape[1:])
            self._put(layer, site, name, value)

    def add_experts(self, layer: int, experts: Tensor) -> None:
        """moe_act's expert of each slot, int [N, k]."""
        self._put(layer, "moe_act", "experts", experts.to(_STORED_DTYPE["experts"]))

    def assemble(self) -> Tensor:
        """-> arena uint8 [N, bytes_per_token]; every field must have been given."""
        missing = [k for k in self.layout.fields if k not in self.parts]
        if missing:
            raise ValueError(f"guidance of this step lacks {missing[:4]}{' ...' if len(missing) > 4 else ''}")
        return torch.cat([self.parts[k] for k in self.layout.fields], dim=1)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
