"""Reference semantics of the NVFP4 MoE grouped GEMM and its fused epilogues (docs/moe_gemm.md).

For sorted routed rows m of expert e (offsets[e] <= m < offsets[e+1]) and weight row n:
    acc[m, n] = sum_k a[src(m), k] * (value(q_w[e, n, k]) * b_w[e, n, k/16])        (FP32)
    y[m, n]   = acc[m, n] * (s_w[e] * s_a[m])                                      (FP32)
src(m) = row_index[m] (gathered token rows) or m, and s_a[m] = row_scale[src(m)]. `a` is BF16: either the exact "code x block
scale" activation of nvfp4 quantization with its row scale s_a (W4A4), or plain BF16 with
s_a = 1 (W4A16). Epilogues:
    plain    out[m, n] = bf16(y[m, n])
    gate_up  gate, up = split_gate_up(y) (interleaved rows, moe_layout); h = bf16(silu(gate) * up),
             silu(g) = g / (1 + exp(-g)) in FP32; then q = nvfp4.quantize(h) (row scale over all
             of I), the down GEMM's operand dequantize(q, bf16, apply_scale=False) and the
             compact guidance bits.
    down     ys[m, :] = y[m, :] * router_weight[m] (FP32), stored as FP16 scaled by a power of two per
             pair of columns (moe_slot_rows: 2.5 bytes a value); out[t, :] = bf16(((ys'[r0] + ys'[r1]) + ...)),
             ys' the decoded rows (FP32), r_j = slot_rows[t, j], summed in slot order (deterministic; no atomics).
Accumulation is FP32 by default (`acc_dtype=torch.float64` for tests); a kernel matches to
FP32-accumulation tolerance, while its fused quantization must equal nvfp4.quantize of its own h.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import nvfp4
from .moe_layout import MoEWeights, dequantize_weights, split_gate_up
from .moe_routing import MoERouting, check_offsets, check_row_index
from .moe_slot_rows import decode_slot_rows, encode_slot_rows

__all__ = [
    "GateUpOutput",
    "check_gemm_inputs",
    "moe_down_ref",
    "moe_gate_up_ref",
    "moe_gemm_ref",
    "quantize_activations",
]


@dataclass(frozen=True)
class GateUpOutput:
    h: torch.Tensor  # bf16 [M, I]: SwiGLU output before quantization
    q: nvfp4.NVFP4Tensor  # codes [M, I/2], block_scales [M, I/16], scale [M]
    a_next: torch.Tensor  # bf16 [M, I]: value(code) * block scale, the down GEMM's operand
    mantissa_bits: torch.Tensor  # uint8 [M, I/8]: compact TRACE guidance bits


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, K] -> (a bf16 [R, K] = value(code) * block scale, s_a float32 [R]) for W4A4."""
    q = nvfp4.quantize(x)
    return nvfp4.dequantize(q, torch.bfloat16, apply_scale=False), q.scale


def check_gemm_inputs(a: torch.Tensor, weights: MoEWeights, offsets: torch.Tensor,
                      row_index: torch.Tensor | None, row_scale: torch.Tensor | None,
                      *, validate_values: bool = True) -> int:
    """Validate a grouped-GEMM call; return M (routed rows). Raises TypeError/ValueError."""
    if not isinstance(a, torch.Tensor) or a.dtype != torch.bfloat16:
        raise TypeError(f"a must be a bfloat16 tensor, got {getattr(a, 'dtype', type(a))}")
    if a.dim() != 2:
        raise ValueError(f"a must be [rows, K], got shape {tuple(a.shape)}")
    if not isinstance(weights, MoEWeights):
        raise TypeError(f"weights must be moe_layout.MoEWeights, got {type(weights).__name__}")
    weights.validate(k=a.shape[1])
    m = a.shape[0] if row_index is None else row_index.shape[0]
    for t, name in ((a, "a"), (offsets, "offsets"), (row_index, "row_index"), (row_scale, "row_scale")):
        if t is not None and t.device != weights.device:
            raise ValueError(f"{name} is on {t.device} but the weights are on {weights.device}")
    if row_scale is not None:
        if row_scale.dtype != torch.float32 or tuple(row_scale.shape) != (a.shape[0],):
            raise ValueError(f"row_scale must be float32 [rows of a]=[{a.shape[0]}] (one per row of a, gathered "
                             f"like a), got {row_scale.dtype} {tuple(row_scale.shape)}")
    if validate_values:
        check_offsets(offsets, weights.num_experts, m)
        if row_index is not None:
            check_row_index(row_index, m, a.shape[0])
        if row_scale is not None:
            nvfp4.check_finite(row_scale, "row_scale")
        nvfp4.check_finite(a, "a")
    return m


def _grouped_scaled_matmul(a: torch.Tensor, weights: MoEWeights, offsets: torch.Tensor,
                           row_index: torch.Tensor | None, row_scale: torch.Tensor | None,
                           acc_dtype: torch.dtype) -> torch.Tensor:
    """y [M, N] float32 = (a[src] @ W_e^T, accumulated in acc_dtype) * (s_w[e] * s_a[m])."""
    m = check_gemm_inputs(a, weights, offsets, row_index, row_scale)
    src = None if row_index is None else row_index.long()
    rows = a if src is None else a[src]  # [M, K]
    w = dequantize_weights(weights, apply_scale=False).to(acc_dtype)  # [E, N, K], exact
    bounds = offsets.tolist()
    y = torch.empty(m, weights.n, dtype=torch.float32, device=a.device)  # [M, N]
    if row_scale is None:
        s_a = torch.ones(m, dtype=torch.float32, device=a.device)  # [M]
    else:
        s_a = row_scale if src is None else row_scale[src]  # [M]
    for e in range(weights.num_experts):
        lo, hi = bounds[e], bounds[e + 1]
        if lo == hi:
            continue
        acc = (rows[lo:hi].to(acc_dtype) @ w[e].T).to(torch.float32)  # [rows_e, N]
        y[lo:hi] = acc * (weights.scale[e] * s_a[lo:hi]).unsqueeze(1)
    return y


def moe_gemm_ref(a: torch.Tensor, weights: MoEWeights, offsets: torch.Tensor, *,
                 row_index: torch.Tensor | None = None, row_scale: torch.Tensor | None = None,
                 acc_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Plain epilogue: bf16 [M, N]."""
    return _grouped_scaled_matmul(a, weights, offsets, row_index, row_scale, acc_dtype).to(torch.bfloat16)


def swiglu_bf16(y: torch.Tensor) -> torch.Tensor:
    """Interleaved FP32 gate_up [M, 2I] -> bf16 [M, I] = bf16(silu(gate) * up)."""
    gate, up = split_gate_up(y)
    silu = gate / (1.0 + torch.exp(-gate))
    return (silu * up).to(torch.bfloat16)


def quantize_swiglu(h: torch.Tensor) -> GateUpOutput:
    """The fused epilogue's outputs for a given bf16 SwiGLU h [M, I] (exactly nvfp4.quantize)."""
    q = nvfp4.quantize(h)
    return GateUpOutput(h=h, q=q, a_next=nvfp4.dequantize(q, torch.bfloat16, apply_scale=False),
                        mantissa_bits=nvfp4.make_guidance(q).mantissa_bits)


def moe_gate_up_ref(a: torch.Tensor, weights: MoEWeights, offsets: torch.Tensor, *,
                    row_index: torch.Tensor | None = None, row_scale: torch.Tensor | None = None,
                    acc_dtype: torch.dtype = torch.float32) -> GateUpOutput:
    """gate_up GEMM (interleaved weights [E, 2I, H]) + SwiGLU + NVFP4 row quantization + guidance."""
    if weights.n % 16:
        raise ValueError(f"gate_up weights need 2I % 16 == 0, got N={weights.n}")
    y = _grouped_scaled_matmul(a, weights, offsets, row_index, row_scale, acc_dtype)  # [M, 2I]
    return quantize_swiglu(swiglu_bf16(y))


def combine_slots(ys: torch.Tensor, slot_rows: torch.Tensor) -> torch.Tensor:
    """ys float32 [M, H] (the decoded per-slot rows), slot_rows int32 [T, k] -> bf16 [T, H], summing slots in order
    0..k-1."""
    idx = slot_rows.long()
    total = ys[idx[:, 0]].clone()  # [T, H]
    for j in range(1, idx.shape[1]):
        total = total + ys[idx[:, j]]
    return total.to(torch.bfloat16)


def moe_down_ref(a: torch.Tensor, weights: MoEWeights, routing: MoERouting, *,
                 row_scale: torch.Tensor | None = None,
                 acc_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """down GEMM over sorted rows a [M, I] + router weight + ordered top-k combine -> bf16 [T, H]."""
    if routing.row_weight is None:
        raise ValueError("the down epilogue needs routing.row_weight (route(..., topk_weights=...))")
    y = _grouped_scaled_matmul(a, weights, routing.offsets, None, row_scale, acc_dtype)  # [M, H]
    ys = y * routing.row_weight.unsqueeze(1)  # [M, H]
    return combine_slots(decode_slot_rows(encode_slot_rows(ys)), routing.slot_rows)
