"""Qwen3 building blocks: RMSNorm, RoPE, GQA attention with q/k norm, dense SwiGLU MLP, and the
dense (non-paged) attention backend used by the plain ``model(input_ids)`` forward.

Activations are flat token matrices (``N`` tokens of a batch, in any order); the attention backend
knows which tokens belong together. Backend protocol: ``backend(layer, q [N, Hq, D], k [N, Hkv, D],
v [N, Hkv, D]) -> [N, Hq, D]`` (the rollout engine passes a paged-KV backend instead).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """Normalise in FP32, scale in the input dtype (as Hugging Face Qwen3 does)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype) -> tuple[Tensor, Tensor]:
    """cos, sin [N, D] for absolute positions int64 [N] (half-split rotation layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64,
                                             device=positions.device).float() / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [N, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [N, D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [N, H, D]; cos/sin [N, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Attention(nn.Module):
    def __init__(self, config, layer: int):
        super().__init__()
        c = config
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = (c.num_attention_heads,
                                                            c.num_key_value_heads, c.head_dim)
        self.rope_theta = c.rope_theta
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], backend, quant, index) -> Tensor:
        """x [N, H]; rope: (cos, sin) [N, D] from ``rope_cos_sin`` of the tokens' positions (the
        same for every layer, so the model computes it once per forward)."""
        N = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(N, self.num_heads, self.head_dim))  # [N, Hq, D]
        k = self.k_norm(self.k_proj(x).view(N, self.num_kv_heads, self.head_dim))  # [N, Hkv, D]
        v = self.v_proj(x).view(N, self.num_kv_heads, self.head_dim)  # [N, Hkv, D]
        cos, sin = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if quant is not None:
            k = quant.activation(self.layer, "k", k, index)
            v = quant.activation(self.layer, "v", v, index)
        out = backend(self.layer, q, k, v)  # [N, Hq, D]
        return self.o_proj(out.reshape(N, self.num_heads * self.head_dim))


class DenseMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class AttentionMask:
    """Which keys each query sees, for every layer of one forward (or engine step).

    allowed bool [B, Tq, S]. SDPA turns a boolean mask into an additive one (0 / -inf in q's dtype,
    two elementwise kernels) on every call; ``additive`` builds that once per dtype, in one kernel,
    and the layers share it. The attention is bitwise what the boolean mask gives."""

    def __init__(self, allowed: Tensor):
        self.allowed = allowed
        self._additive: dict[torch.dtype, Tensor] = {}

    def additive(self, dtype: torch.dtype) -> Tensor:  # [B, Tq, S]
        if dtype not in self._additive:
            zero = torch.zeros((), dtype=dtype, device=self.allowed.device)
            self._additive[dtype] = torch.where(self.allowed, zero, float("-inf"))
        return self._additive[dtype]


def masked_attention(q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask) -> Tensor:
    """q [B, Hq, Tq, D], k/v [B, Hkv, S, D] (q's dtype), mask over [B, Tq, S] -> [B, Hq, Tq, D].

    Every query row must allow at least one key (its own position). Query head h reads kv head
    h // (Hq / Hkv) (SDPA's enable_gqa; no repeated K/V copies)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.additive(q.dtype)[:, None],
                                          enable_gqa=q.shape[1] != k.shape[1])


class DenseAttention:
    """Causal attention among the tokens of a padded [B, T] batch, given flat tokens.

    b_idx, t_idx int64 [N]: batch row and column of each flat token (a row's real tokens are
    causal in column order; missing columns are padding and never attended)."""

    def __init__(self, b_idx: Tensor, t_idx: Tensor, B: int, T: int):
        self.b_idx, self.t_idx, self.B, self.T = b_idx, t_idx, B, T
        real = torch.zeros(B, T, dtype=torch.bool, device=b_idx.device)
        real[b_idx, t_idx] = True
        causal = torch.ones(T, T, dtype=torch.bool, device=b_idx.device).tril()
        allowed = causal[None] & real[:, None, :]  # [B, T, T]
        # padding query rows: let them see column 0 so softmax stays finite (outputs are dropped)
        allowed[:, :, 0] |= ~real
        self.mask = AttentionMask(allowed)

    def _pad(self, x: Tensor) -> Tensor:  # [N, H, D] -> [B, H, T, D]
        out = x.new_zeros(self.B, self.T, *x.shape[1:])
        out[self.b_idx, self.t_idx] = x
        return out.transpose(1, 2)

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        out = masked_attention(self._pad(q), self._pad(k), self._pad(v), self.mask)
        return out.transpose(1, 2)[self.b_idx, self.t_idx]  # [N, Hq, D]
