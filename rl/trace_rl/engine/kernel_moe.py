"""The kernel-backed nvfp4 step: packed NVFP4 expert weights, refit, and the MoE / K/V executor.

``PackedExperts`` holds every MoE layer's expert weights in the layout the MoE GEMM reads
(``moe_layout.MoEWeights``; gate/up interleaved), allocated once: ``refit`` quantizes new weights
straight into them with ``ops.refit_weights_packed_`` (one op: refit_weights' numerics, the packed,
encoded layout written in place; no natural-layout staging), so the addresses a captured CUDA graph
holds never change.

``KernelQuantizer`` is the ``Quantizer`` the model sees in this mode. It takes over the whole MoE
block (``run_moe``, called by ``SparseMoeBlock``): router -> ``kernel_routing`` -> one
``quantize`` of the token rows (codes, scales, BF16 operand and guidance bits in one pass) ->
fused gate_up GEMM (rows gathered through ``row_index``; SwiGLU + NVFP4 quantization + guidance in
the epilogue) -> down GEMM with router weights and the ordered top-k combine. K and V go through
``quantize`` per (token, kv head) into the NVFP4 pages. With capture on, every guidance output is
collected for the step's arena (``GuidanceParts``); nothing here synchronises the host.

In steps where every sequence has one new token (decode), ``KernelDecodeAttention`` replaces the
torch paged attention when the engine enables the paged-KV kernels: ``kv_append`` quantizes K and V
into the pages and emits their guidance in one launch, ``decode_attention`` attends over the NVFP4
pages (FP32 dequantization in registers); the quantizer then defers K/V to it (``defer_kv``).

Two op sets share that code: ``KERNEL_OPS`` (``trace_kernels.ops`` / ``moe_gemm`` / ``kv_append`` /
``attention``; on CPU tensors they run their own references) and ``EMULATED_OPS`` (the references
``nvfp4`` / ``moe_gemm_ref`` / ``kv_append_reference`` / ``decode_attention_reference`` on any device:
the kernels' semantics in torch, what the GPU tests compare the kernels against).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from trace_kernels import kv_codes, moe_gemm, moe_gemm_ref, moe_layout, nvfp4
from trace_kernels import ops as tk_ops
from trace_rl.engine.kernel_layout import GuidanceParts, empty_moe_weights, kernel_routing
from trace_rl.model.moe import route
from trace_rl.quant import GuidanceRecorder, TokenIndex


# ----------------------------------------------------------------------------- op sets

@dataclass(frozen=True)
class QuantizedRows:
    q: nvfp4.NVFP4Tensor  # codes [..., D/2], block_scales [..., D/16], scale [...]
    bits: Tensor | None  # uint8 [..., D/8] when asked
    operand: Tensor | None  # bf16 [..., D] = value(code) * block scale, when asked


@dataclass(frozen=True)
class MoEOps:
    name: str
    quantize: Callable[..., QuantizedRows]  # (x, guidance: bool, dequant: bool)
    gate_up: Callable  # (a, weights, offsets, row_index, row_scale) -> GateUpOutput
    down: Callable  # (a, weights, routing, row_scale) -> bf16 [T, H]
    kv_append: Callable  # (k, v, slots, k_pages, v_pages, guidance: bool) -> KVGuidance | None
    decode_attention: Callable  # (q [B, Hq, D], k_pages, v_pages, block_table, lengths) -> [B, Hq, D]


def _kernel_quantize(x, guidance, dequant):
    r = tk_ops.quantize(x, guidance=guidance, dequant=dequant)
    return QuantizedRows(r.q, r.mantissa_bits, r.dequant)


def _emulated_quantize(x, guidance, dequant):
    q = nvfp4.quantize(x)
    bits = nvfp4.make_guidance(q, "compact").mantissa_bits if guidance else None
    return QuantizedRows(q, bits, nvfp4.dequantize(q, torch.bfloat16, apply_scale=False) if dequant else None)


# The paged-KV modules are imported when first used: the engine runs without them.
def _kv_append_kernel(k, v, slots, k_pages, v_pages, guidance):
    from trace_kernels import kv_append
    return kv_append.kv_append(k, v, slots, k_pages, v_pages, guidance=guidance, check_values=False)


def _kv_append_emulated(k, v, slots, k_pages, v_pages, guidance):
    from trace_kernels import kv_append
    return kv_append.kv_append_reference(k, v, slots, k_pages, v_pages, guidance=guidance)


def _decode_attention_kernel(q, k_pages, v_pages, block_table, lengths):
    from trace_kernels import attention
    return attention.decode_attention(q, k_pages, v_pages, block_table, lengths, check_values=False)


def _decode_attention_emulated(q, k_pages, v_pages, block_table, lengths):
    from trace_kernels import attention
    return attention.decode_attention_reference(q, k_pages, v_pages, block_table, lengths)


KERNEL_OPS = MoEOps(
    "kernels", _kernel_quantize,
    # validate=False / check_values=False: offsets, rows and slots come from the engine; reading
    # them back would sync. pdl=True: the GEMMs follow the quantize and the gate_up (run_moe), which
    # write neither the expert weights nor the routing offsets (moe_gemm's docstring)
    lambda a, w, off, ri, rs: moe_gemm.moe_gate_up(a, w, off, row_index=ri, row_scale=rs, validate=False, pdl=True),
    lambda a, w, routing, rs: moe_gemm.moe_down(a, w, routing, row_scale=rs, validate=False, pdl=True),
    _kv_append_kernel, _decode_attention_kernel)

EMULATED_OPS = MoEOps(
    "kernels_emulated", _emulated_quantize,
    lambda a, w, off, ri, rs: moe_gemm_ref.moe_gate_up_ref(a, w, off, row_index=ri, row_scale=rs),
    lambda a, w, routing, rs: moe_gemm_ref.moe_down_ref(a, w, routing, row_scale=rs),
    _kv_append_emulated, _decode_attention_emulated)


# ----------------------------------------------------------------------------- weights

class PackedExperts:
    """NVFP4 expert weights of every MoE layer in the MoE GEMM's layout (addresses fixed)."""

    def __init__(self, model, device):
        self.device = torch.device(device)
        self.gate_up: dict[int, moe_layout.MoEWeights] = {}  # layer -> [E, 2I, H] interleaved
        self.down: dict[int, moe_layout.MoEWeights] = {}  # layer -> [E, H, I]
        self.param_site: dict[str, tuple[int, str]] = {}  # parameter name -> (layer, gate_up|down)
        for l, layer in enumerate(model.model.layers):
            if not layer.is_moe:
                continue
            block = layer.mlp
            for name, p, table in (("gate_up", block.w_gate_up, self.gate_up), ("down", block.w_down, self.down)):
                E, N, K = p.shape
                table[l] = empty_moe_weights(E, N, K, self.device)
                self.param_site[f"model.layers.{l}.mlp.w_{name}"] = (l, name)

    def refit(self, layer: int, name: str, w: Tensor) -> None:
        """w [E, N, K] (any float dtype the kernel takes, on the engine's device) -> packed, in place.
        Per expert exactly ``nvfp4.quantize(w[e], scale="tensor")``; gate_up rows [gate; up] are stored
        interleaved (= refit_weights + ``moe_layout.store_fragments_``, bit for bit)."""
        if name == "gate_up":
            tk_ops.refit_weights_packed_(w.contiguous(), self.gate_up[layer], groups=2)
        else:
            tk_ops.refit_weights_packed_(w.contiguous(), self.down[layer], groups=1)

    def tensors(self) -> list[Tensor]:
        return [t for table in (self.gate_up, self.down) for w in table.values()
                for t in (w.codes, w.block_scales, w.scale)]

    def data_ptrs(self) -> list[int]:
        return [t.data_ptr() for t in self.tensors()]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


# ----------------------------------------------------------------------------- the step's quantizer

class KernelQuantizer:
    """The nvfp4 ``Quantizer`` of one step (or of a full model forward when ``kv_store`` is None).

    experts: PackedExperts; ops: KERNEL_OPS | EMULATED_OPS; guidance: None | "compact" | "full";
    parts: the step's ``GuidanceParts`` (None: capture off), assembled into its arena by the runner;
    kv_store(layer, site, q):
    writes K/V codes into the pages (None: a plain forward, K/V come back dequantized);
    shadow: a reference ``GuidanceRecorder`` that records ``nvfp4.quantize`` of the very tensors the
    kernels quantized (eager only; the tests compare it with the kernels' guidance bit for bit).
    defer_kv: K/V pass through ``activation`` untouched; ``KernelDecodeAttention`` appends them.
    """

    def __init__(self, experts: PackedExperts, ops: MoEOps = KERNEL_OPS, guidance: str | None = None,
                 parts: GuidanceParts | None = None,
                 kv_store: Callable[[int, str, nvfp4.NVFP4Tensor], None] | None = None,
                 shadow: GuidanceRecorder | None = None, defer_kv: bool = False):
        if (parts is None) != (guidance is None):
            raise ValueError("guidance capture needs a mode and the step's GuidanceParts together")
        self.experts, self.ops, self.guidance = experts, ops, guidance
        self.parts, self.kv_store, self.shadow = parts, kv_store, shadow
        self.defer_kv = defer_kv

    # ---- Quantizer protocol
    def weight(self, layer: int, name: str, w: Tensor) -> Tensor:
        raise RuntimeError("KernelQuantizer runs the MoE block itself (run_moe); weights are packed by refit")

    def activation(self, layer: int, site: str, x: Tensor, index: TokenIndex,
                   experts: Tensor | None = None) -> Tensor:
        if site not in ("k", "v"):
            raise ValueError(f"KernelQuantizer handles the MoE sites in run_moe, not {site!r}")
        if self.defer_kv:
            return x  # KernelDecodeAttention quantizes it into the pages (kv_append)
        r = self.ops.quantize(x.contiguous(), self.guidance == "compact", False)  # [N, Hkv, D]
        self._capture(layer, site, r)
        if self.shadow is not None:
            self.shadow.record(layer, site, nvfp4.quantize(x.detach()), index)
        if self.kv_store is None:
            return nvfp4.dequantize(r.q, dtype=x.dtype)
        self.kv_store(layer, site, r.q)
        return x  # the paged backend attends over the stored codes, not this tensor

    # ---- the MoE block
    def run_moe(self, block, x: Tensor, index: TokenIndex, forced: Tensor | None):
        """x [N, H] bf16 -> (y [N, H] bf16, experts int64 [N, k])."""
        layer, E = block.layer, block.num_experts
        weights, experts = route(block.gate(x), block.top_k, block.norm_topk_prob, forced)  # [N, k] x2
        routing = kernel_routing(experts, weights, E)
        r = self.ops.quantize(x.contiguous(), self.guidance == "compact", True)  # rows [N, H]
        up = self.ops.gate_up(r.operand, self.experts.gate_up[layer], routing.offsets, routing.row_index,
                              r.q.scale)  # sorted rows [M, I]
        y = self.ops.down(up.a_next, self.experts.down[layer], routing, up.q.scale)  # [N, H]
        self._capture(layer, "moe_in", r)
        if self.parts is not None:  # moe_act by (token, slot): the sorted rows gathered
            self._capture(layer, "moe_act", QuantizedRows(up.q, up.mantissa_bits, None),
                          rows=routing.slot_rows.long())  # [N, k]
            self.parts.add_experts(layer, experts)
        if self.shadow is not None:
            self.shadow.record(layer, "moe_in", nvfp4.quantize(x.detach()), index)
            h_by_slot = up.h[routing.slot_rows.long()]  # [N, k, I]: the kernel's own SwiGLU output
            self.shadow.record(layer, "moe_act", nvfp4.quantize(h_by_slot), index, experts)
        return y, experts

    def append_kv(self, layer: int, k: Tensor, v: Tensor, slots: Tensor, k_pages, v_pages,
                  index: TokenIndex) -> None:
        """kv_append of k, v [N, Hkv, D] at slots int64 [N]; their guidance into the arena (compact:
        the kernel's own guidance outputs; full: the codes read back from the pages)."""
        compact = self.guidance == "compact"
        g = self.ops.kv_append(k.contiguous(), v.contiguous(), slots, k_pages, v_pages, compact)
        if self.parts is not None:
            for site, pages, gx in (("k", k_pages, g.k if compact else None), ("v", v_pages, g.v if compact else None)):
                if compact:
                    q, bits = nvfp4.NVFP4Tensor(None, gx.block_scales, gx.scale), gx.mantissa_bits
                else:  # the codes as stored: [slots, Hkv, ...] rows of the flattened pages
                    flat = lambda t: t.view(t.shape[0] * t.shape[1], *t.shape[2:])
                    bscales = flat(pages.block_scales).view(torch.uint8)[slots].view(torch.float8_e4m3fn)
                    q, bits = nvfp4.NVFP4Tensor(kv_codes.decode_codes(flat(pages.codes)[slots]), bscales,
                                                 flat(pages.scale)[slots]), None
                self._capture(layer, site, QuantizedRows(q, bits, None))
        if self.shadow is not None:
            self.shadow.record(layer, "k", nvfp4.quantize(k.detach()), index)
            self.shadow.record(layer, "v", nvfp4.quantize(v.detach()), index)

    def _capture(self, layer: int, site: str, r: QuantizedRows, rows: Tensor | None = None) -> None:
        """One site's guidance for the arena (rows: gather sorted rows into (token, slot) order)."""
        if self.parts is None:
            return
        self.parts.add_rows(layer, site, r.q.scale, r.q.block_scales,
                            r.bits if self.guidance == "compact" else r.q.codes, rows)


class KernelDecodeAttention:
    """Attention backend of a step where every sequence has exactly one new token: kv_append of
    the new K/V, then decode_attention over the pages. In nvfp4 mode the append goes through the
    step's quantizer (which captures the K/V guidance); in bf16 mode (quant None) it scatters BF16
    rows. lengths = position + 1; padded graph rows have position 0 and a block table of the
    scratch page 0."""

    def __init__(self, cache, ops: MoEOps, slots: Tensor, block_tables: Tensor, positions: Tensor,
                 index: TokenIndex, quant: KernelQuantizer | None = None):
        self.cache, self.ops, self.quant, self.slots, self.index = cache, ops, quant, slots, index
        self.block_table = block_tables.to(torch.int32)  # [B, max_pages]
        self.lengths = (positions + 1).to(torch.int32)  # [B]

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """q [B, Hq, D], k/v [B, Hkv, D] -> [B, Hq, D]."""
        k_pages, v_pages = self.cache.k[layer], self.cache.v[layer]
        if self.quant is not None:
            self.quant.append_kv(layer, k, v, self.slots, k_pages, v_pages, self.index)
        else:
            self.ops.kv_append(k.contiguous(), v.contiguous(), self.slots, k_pages, v_pages, False)
        return self.ops.decode_attention(q.contiguous(), k_pages, v_pages, self.block_table, self.lengths)
