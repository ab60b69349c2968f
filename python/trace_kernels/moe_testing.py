"""Random MoE GEMM problems for tests and benchmarks (fresh random data, never zeros)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .moe_gemm_ref import quantize_activations
from .moe_layout import MoEWeights, interleave_gate_up, quantize_weights
from .moe_routing import MoERouting, route
from .shapes import ModelShape

# A test shape whose 64-wide K chunks are odd in number (H: 9, I: 5), like gpt-oss's H = I = 2880 (45): the tiles that
# take K in pairs of chunks fall back to others there (tests/gpu/test_moe_gemm.py, profiling/moe_prebuild.py)
ODD_CHUNKS_SHAPE = ModelShape("odd-chunks", experts=8, hidden=576, intermediate=320, top_k=2, q_heads=4, kv_heads=2,
                              head_dim=64)


@dataclass(frozen=True)
class MoEProblem:
    x: torch.Tensor  # bf16 [T, H] token activations
    a: torch.Tensor  # bf16 [T, H] value(code) * block scale of x (W4A4 operand)
    s_a: torch.Tensor  # float32 [T] row scales of x
    gate_up: MoEWeights  # [E, 2I, H], gate/up interleaved
    down: MoEWeights  # [E, H, I]
    routing: MoERouting
    topk_ids: torch.Tensor  # int64 [T, k]


def random_topk(tokens: int, experts: int, top_k: int, generator: torch.Generator, *, skew: float = 0.0) -> torch.Tensor:
    """Distinct experts per token; skew > 0 concentrates tokens on low-numbered experts (uneven routing)."""
    logits = torch.rand(tokens, experts, generator=generator)
    if skew:
        logits = logits - skew * torch.arange(experts, dtype=torch.float32) / experts
    return logits.topk(top_k, dim=1).indices  # [T, k]


def random_weights(experts: int, n: int, k: int, seed: int, device) -> torch.Tensor:
    """FP32 [E, N, K], drawn on `device`; ~1/sqrt(K) keeps outputs O(1), per-expert magnitudes vary."""
    gen = torch.Generator(device=device).manual_seed(seed)
    w = torch.randn(experts, n, k, generator=gen, device=device) / k ** 0.5
    return w * (0.5 + torch.rand(experts, 1, 1, generator=gen, device=device))


def make_weights(experts: int, hidden: int, intermediate: int, *, seed: int = 0,
                 device="cpu") -> tuple[MoEWeights, MoEWeights]:
    """(gate_up [E, 2I, H] interleaved, down [E, H, I]) as MoEWeights."""
    gate = random_weights(experts, intermediate, hidden, seed, device)
    up = random_weights(experts, intermediate, hidden, seed + 1, device)
    gate_up = quantize_weights(interleave_gate_up(gate, up))
    del gate, up
    return gate_up, quantize_weights(random_weights(experts, hidden, intermediate, seed + 2, device))


def make_problem(experts: int, hidden: int, intermediate: int, top_k: int, tokens: int, *, seed: int = 0,
                 device="cpu", skew: float = 0.0,
                 weights: tuple[MoEWeights, MoEWeights] | None = None) -> MoEProblem:
    gate_up, down = weights if weights is not None else make_weights(experts, hidden, intermediate, seed=seed,
                                                                      device=device)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen).to(device=device, dtype=torch.bfloat16)
    ids = random_topk(tokens, experts, top_k, gen, skew=skew).to(device)
    router = torch.softmax(torch.randn(tokens, top_k, generator=gen), dim=1).to(device)
    a, s_a = quantize_activations(x)
    return MoEProblem(x=x, a=a, s_a=s_a, gate_up=gate_up, down=down, routing=route(ids, experts, router),
                      topk_ids=ids)
