"""Sparse MoE block of Qwen3-MoE with expert weights stacked for grouped GEMMs.

Expert weights: ``w_gate_up`` [E, 2I, H] (rows 0..I-1 are gate_proj, I..2I-1 up_proj) and
``w_down`` [E, H, I]; each is [E, N, K] with K the GEMM reduction dim (NVFP4 blocks run along K).

Dispatch: the N*k (token, slot) pairs are sorted by expert (stable, so token order within an
expert); ``offsets`` int32 [E+1] delimits each expert's rows and ``row_index`` int64 [N*k] names the
token row of each sorted slot. That is the interface of the grouped GEMM kernel (issue 4):
``grouped_linear(a [M, K], w [E, N, K], offsets, row_index) -> [R, N]``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _grouped_mm_ok(rows: Tensor) -> bool:
    """torch._grouped_mm: BF16 on Hopper or newer (no host sync: offsets stay on the device)."""
    return (rows.is_cuda and rows.dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm")
            and torch.cuda.get_device_capability(rows.device)[0] >= 9)


def grouped_linear(a: Tensor, w: Tensor, offsets: Tensor, row_index: Tensor | None = None) -> Tensor:
    """out[r] = a[row_index[r]] @ w[e].T for rows r in [offsets[e], offsets[e+1]).

    a [M, K]; w [E, N, K]; offsets int32 [E+1] (offsets[0] = 0, offsets[E] = R); row_index int64 [R]
    (None: the identity, R = M) -> out [R, N] in a's dtype.
    """
    rows = a if row_index is None else a.index_select(0, row_index)  # [R, K]
    if _grouped_mm_ok(rows):
        # column-major mat2 view [E, K, N]; offs = cumulative row ends [E]
        return torch._grouped_mm(rows, w.transpose(-2, -1), offs=offsets[1:])
    out = rows.new_empty(rows.shape[0], w.shape[1])  # [R, N]
    bounds = offsets.tolist()
    for e in range(w.shape[0]):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            out[lo:hi] = rows[lo:hi] @ w[e].T
    return out


def route(router_logits: Tensor, top_k: int, norm_topk_prob: bool,
          forced: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """router_logits [N, E] -> (weights [N, k] FP32, experts int64 [N, k]).

    Softmax in FP32; ``forced`` int64 [N, k] (routing replay) replaces the top-k choice but the
    weights still come from the router probabilities at those experts. A forced row holding any
    negative id is routed by the router itself (the rollout has no routing for its last token)."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)  # [N, E]
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if forced is not None:
        forced = forced.to(torch.int64)
        use = (forced >= 0).all(dim=-1, keepdim=True)  # [N, 1]
        experts = torch.where(use, forced, experts)
        weights = probs.gather(1, experts)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def sort_by_expert(experts: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor]:
    """experts int64 [N, k] -> (order int64 [N*k] (sorted slot -> flat slot), row_index int64 [N*k]
    (sorted slot -> token), offsets int32 [E+1])."""
    flat = experts.reshape(-1)  # [N*k]
    order = torch.argsort(flat, stable=True)
    row_index = order // experts.shape[1]
    # index_add instead of bincount: no device->host sync (CUDA-graph safe)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=experts.device)
    counts.index_add_(0, flat, torch.ones_like(flat))  # [E]
    offsets = torch.zeros(num_experts + 1, dtype=torch.int32, device=experts.device)
    offsets[1:] = torch.cumsum(counts, 0)
    return order, row_index, offsets


class SparseMoeBlock(nn.Module):
    def __init__(self, config, layer: int):
        super().__init__()
        c = config
        self.layer = layer
        self.num_experts, self.top_k = c.num_experts, c.num_experts_per_tok
        self.norm_topk_prob = c.norm_topk_prob
        self.intermediate = c.moe_intermediate_size
        self.gate = nn.Linear(c.hidden_size, c.num_experts, bias=False)  # the router
        self.w_gate_up = nn.Parameter(torch.empty(c.num_experts, 2 * c.moe_intermediate_size,
                                                  c.hidden_size))  # [E, 2I, H]
        self.w_down = nn.Parameter(torch.empty(c.num_experts, c.hidden_size,
                                               c.moe_intermediate_size))  # [E, H, I]

    def forward(self, x: Tensor, quant=None, index=None, forced: Tensor | None = None):
        """x [N, H] -> (y [N, H], experts int64 [N, k]).

        A quantizer with a ``run_moe(block, x, index, forced)`` method runs the whole block itself
        (the rollout engine's fused NVFP4 kernels: packed weights, fused epilogues)."""
        run_moe = getattr(quant, "run_moe", None)
        if run_moe is not None:
            return run_moe(self, x, index, forced)
        N, k, I = x.shape[0], self.top_k, self.intermediate
        weights, experts = route(self.gate(x), k, self.norm_topk_prob, forced)  # [N, k] x2
        order, row_index, offsets = sort_by_expert(experts, self.num_experts)
        w_gate_up, w_down = self.w_gate_up, self.w_down
        if quant is not None:
            w_gate_up = quant.weight(self.layer, "gate_up", w_gate_up)
            w_down = quant.weight(self.layer, "down", w_down)
            x = quant.activation(self.layer, "moe_in", x, index)
        gate_up = grouped_linear(x, w_gate_up, offsets, row_index)  # [N*k, 2I] sorted
        act = F.silu(gate_up[:, :I]) * gate_up[:, I:]  # [N*k, I] sorted
        if quant is not None:
            by_slot = torch.empty_like(act)
            by_slot[order] = act
            by_slot = quant.activation(self.layer, "moe_act", by_slot.view(N, k, I), index, experts)
            act = by_slot.reshape(N * k, I)[order]
        down = grouped_linear(act, w_down, offsets)  # [N*k, H] sorted
        out = torch.empty_like(down)
        out[order] = down  # [N*k, H] by (token, slot)
        y = (out.view(N, k, -1) * weights.to(x.dtype)[..., None]).sum(dim=1)  # [N, H]
        return y, experts
