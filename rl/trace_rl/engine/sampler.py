"""Sampling with temperature / top-k / top-p and per-sequence random streams.

Randomness is counter-based: the uniform for (sequence, position, vocab id) is a hash of
(seed, sequence key, position, id), and a token is drawn with the Gumbel-max trick
(argmax of log p + Gumbel noise, an exact draw from p). A sequence's tokens therefore depend only
on its own logits, the seed and its key — not on which other sequences share the step, their
order, or how many steps came before — and the whole step is a few vectorised ops (no host loop).

Log-probs are those of the sampling distribution: log_softmax(logits / T) restricted to the top-k
and top-p sets and renormalised. Greedy (T = 0) returns log-prob 0.
"""
from __future__ import annotations

import torch
from torch import Tensor

from trace_rl.engine.config import SamplingParams

_M32 = 0xFFFFFFFF


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit integer finaliser on int64 tensors holding values < 2**32 (products wrap; the low
    32 bits stay exact)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def uniforms(seed: int, seq_keys: Tensor, positions: Tensor, vocab: int) -> Tensor:
    """U(0, 1) float32 [B, V] for sequences seq_keys int64 [B] at positions int64 [B]."""
    dev = seq_keys.device
    ids = torch.arange(vocab, dtype=torch.int64, device=dev)
    h = _mix32(ids + 0x9E3779B9)[None, :]  # [1, V]
    h = _mix32(h ^ (positions[:, None] & _M32))
    h = _mix32(h ^ (seq_keys[:, None] & _M32))
    h = _mix32(h ^ (seq_keys[:, None] >> 32) ^ (seed & _M32))
    h = _mix32(h ^ ((seed >> 32) & _M32))
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def sampling_logprobs(logits: Tensor, params: SamplingParams) -> Tensor:
    """log-probabilities [B, V] (float32) of the sampling distribution; excluded ids are -inf."""
    x = logits.float() / params.temperature
    if params.top_k and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k, dim=-1).values[:, -1:]  # [B, 1]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        probs = torch.softmax(x, dim=-1)
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass strictly before each id
        drop_sorted = before >= params.top_p  # the first id is always kept
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.log_softmax(x, dim=-1)


def sample(logits: Tensor, params: SamplingParams, seed: int, seq_keys: Tensor,
           positions: Tensor) -> tuple[Tensor, Tensor]:
    """logits [B, V] -> (tokens int64 [B], log-probs float32 [B]).

    positions int64 [B]: the position the sampled token will occupy (part of the random key)."""
    if params.temperature == 0:
        return logits.argmax(dim=-1), torch.zeros(logits.shape[0], device=logits.device)
    logp = sampling_logprobs(logits, params)  # [B, V]
    gumbel = -torch.log(-torch.log(uniforms(seed, seq_keys, positions, logits.shape[-1])))
    tokens = torch.argmax(logp + gumbel, dim=-1)  # [B]
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)
