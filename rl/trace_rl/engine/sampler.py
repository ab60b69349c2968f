"""Sampling with temperature / top-k / top-p and per-sequence random streams.

Randomness is counter-based: the uniform for (sequence, position, vocab id) is a hash of
(seed, sequence key, position, id), and a token is drawn with the Gumbel-max trick
(argmax of logits / T + Gumbel noise, an exact draw from softmax(logits / T)). A sequence's tokens
therefore depend only on its own logits, the seed and its key — not on which other sequences share
the step, their order, or how many steps came before — and the whole step is a few vectorised ops
(no host loop).

Scaling by the temperature is a multiplication by fl32(1 / T) (``inv_temperature``), one FP32
rounding on every device (torch on CUDA turns ``x / T`` into that product anyway; on the CPU it
would divide). Log-probs are those of the sampling distribution: log_softmax(logits * (1 / T))
restricted to the top-k and top-p sets and renormalised. Greedy (T = 0) returns log-prob 0.

The plain path (T > 0, no top-k / top-p) draws argmax(s + noise) with s = logits * (1 / T); its
reference is ``trace_kernels.ops.gumbel_sample.reference``. On an sm_90 GPU it runs as one fused
kernel (``trace_kernels.ops.gumbel_max_sample``: no [B, V] temporaries) with the same tokens bit for
bit; the kernel's log-prob is s[token] - logsumexp(s) summed in its own fixed order (per row, never
dependent on the batch), equal to the torch path's log_softmax(s)[token] up to FP32 rounding.
TRACE_KERNELS_SAMPLER=torch forces the torch path (default ``auto``). Top-k / top-p steps draw
argmax(log-probs + noise) in torch.
"""
from __future__ import annotations

import functools
import os
import warnings

import torch
from torch import Tensor

from trace_kernels.ops.gumbel_sample import gumbel_noise, inv_temperature, mix32, reference, scale_logits, uniforms
from trace_rl.engine.config import SamplingParams

__all__ = ["SAMPLER_ENV", "inv_temperature", "mix32", "sample", "sampling_logprobs", "uniforms", "use_kernel"]

SAMPLER_ENV = "TRACE_KERNELS_SAMPLER"  # auto: the kernel where it can run; torch: always the torch path
SAMPLER_CHOICES = ("auto", "torch")


def _plain(params: SamplingParams, vocab: int) -> bool:
    return params.temperature > 0 and (params.top_k == 0 or params.top_k >= vocab) and params.top_p == 1.0


@functools.lru_cache(maxsize=None)
def _kernel_ready(device_index: int, dtype: torch.dtype) -> bool:
    """Whether the sampling kernel loads on this device (once per device and dtype; a failure warns
    once and the torch path runs)."""
    if torch.cuda.get_device_capability(device_index) != (9, 0):
        return False
    try:
        from trace_kernels.codegen.ops import gumbel_sample as codegen_gumbel
        from trace_kernels.runtime import kernel_for
        kernel_for(codegen_gumbel.spec(dtype)).function(device_index)
        return True
    except (ImportError, RuntimeError, OSError, TypeError) as e:  # no cuda-python / nvcc / cubin
        warnings.warn(f"sampling kernel unavailable on cuda:{device_index} ({type(e).__name__}: {e}); "
                      "sampling with torch", stacklevel=3)
        return False


def use_kernel(logits: Tensor, params: SamplingParams) -> bool:
    """True when sample() draws with the fused kernel."""
    choice = os.environ.get(SAMPLER_ENV, "auto").strip().lower() or "auto"
    if choice not in SAMPLER_CHOICES:
        raise ValueError(f"{SAMPLER_ENV}={choice!r}; known: {', '.join(SAMPLER_CHOICES)}")
    if choice == "torch" or logits.device.type != "cuda" or logits.dim() != 2:
        return False
    if not _plain(params, logits.shape[-1]):
        return False
    index = logits.device.index if logits.device.index is not None else torch.cuda.current_device()
    return _kernel_ready(index, logits.dtype)


def sampling_logprobs(logits: Tensor, params: SamplingParams) -> Tensor:
    """log-probabilities [B, V] (float32) of the sampling distribution; excluded ids are -inf."""
    x = scale_logits(logits, inv_temperature(params.temperature))  # [B, V]
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

    seq_keys int64 [B]: each sequence's random-stream key (all 64 bits used). positions int64 [B]:
    the position the sampled token will occupy (part of the random key)."""
    if params.temperature == 0:
        return logits.argmax(dim=-1), torch.zeros(logits.shape[0], device=logits.device)
    if use_kernel(logits, params):
        from trace_kernels.ops import gumbel_max_sample
        return gumbel_max_sample(logits.contiguous(), seed, seq_keys, positions, params.temperature)
    if _plain(params, logits.shape[-1]):
        return reference(logits, inv_temperature(params.temperature), seed, seq_keys, positions)
    logp = sampling_logprobs(logits, params)  # [B, V]
    noise = gumbel_noise(uniforms(seed, seq_keys, positions, logits.shape[-1]))  # [B, V]
    tokens = torch.argmax(logp + noise, dim=-1)  # [B]
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)
