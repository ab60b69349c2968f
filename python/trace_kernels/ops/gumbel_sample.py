"""`gumbel_max_sample`: logits [B, V] -> one token per row drawn from softmax(logits / T) with the
Gumbel-max trick and counter-based noise, and its log-prob. GPU: cuda/include/trace_kernels/gumbel_sample.cuh.

The reference below is the rollout sampler's (trace_rl.engine.sampler) plain path:
    s      = logits.float() * inv_temperature(T)         # [B, V] one FP32 rounding per element
    u      = uniforms(seed, seq_keys, positions, V)      # [B, V] hash of (seed, key, position, id)
    token  = argmax(s + (-log(-log(u))))                 # torch.argmax: first NaN, else first max
    logp   = log_softmax(s)[token]
On the same CUDA device the kernel's tokens equal the reference's bit for bit (it computes the same
FP32 values with the same logf); its log-prob sums exp in its own order (FP32 rounding apart).
"""

from __future__ import annotations

import functools

import torch

from trace_kernels import nvtx
from trace_kernels.codegen.ops import gumbel_sample as codegen_gumbel
from trace_kernels.ops._common import KERNEL_DTYPES, check_cuda_device, check_tensor, new_output

_M32 = 0xFFFFFFFF


# ---------------------------------------------------------------------------------------------
# Reference (CPU and CUDA tensors)
# ---------------------------------------------------------------------------------------------

def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser on int64 tensors holding values < 2**32 (products wrap; the low
    32 bits stay exact)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


# Bounds on gumbel_noise over every u hash_to_uniform makes (exactly [-2.8115, 16.6355]); the
# kernel skips ids that cannot win with them (kGumbelMin / kGumbelMax in gumbel_sample.cuh).
GUMBEL_MIN, GUMBEL_MAX = -2.875, 16.75


def hash_to_uniform(h: torch.Tensor) -> torch.Tensor:
    """32-bit hashes (int64) -> float32 in [2**-24, 1 - 2**-24]: the top 23 bits k give
    (k + 0.5) * 2**-23, exact in FP32, so -log(-log(u)) is always finite (with 24 bits, k + 0.5
    rounds up to 2**24 at the top: u = 1 and infinite noise)."""
    return ((h >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))


def uniforms(seed: int, seq_keys: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """U(0, 1) float32 [B, V] for sequences seq_keys int64 [B] (all 64 bits used) at positions int64
    [B] (low 32 bits used), seed any int (low 64 bits used)."""
    dev = seq_keys.device
    ids = torch.arange(vocab, dtype=torch.int64, device=dev)
    h = mix32((ids + 0x9E3779B9) & _M32)[None, :]  # [1, V]
    h = mix32(h ^ (positions[:, None] & _M32))  # [B, V]
    h = mix32(h ^ (seq_keys[:, None] & _M32))
    h = mix32(h ^ ((seq_keys[:, None] >> 32) & _M32) ^ (seed & _M32))
    h = mix32(h ^ ((seed >> 32) & _M32))
    return hash_to_uniform(h)


def gumbel_noise(u: torch.Tensor) -> torch.Tensor:
    return -torch.log(-torch.log(u))


@functools.lru_cache(maxsize=64)  # every sampling step asks again
def inv_temperature(temperature: float) -> float:
    """fl32(1 / fl32(T)): the factor the logits are scaled by (what torch on CUDA uses for x / T;
    a multiplication is one rounding on every device, a division by a Python float is not)."""
    t = torch.tensor(float(temperature), dtype=torch.float32)
    return float(torch.ones((), dtype=torch.float32) / t)


def scale_logits(logits: torch.Tensor, inv_t: float) -> torch.Tensor:
    return logits.float() * inv_t  # [B, V] float32


def reference(logits: torch.Tensor, inv_t: float, seed: int, seq_keys: torch.Tensor,
              positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens int64 [B], log-probs float32 [B]) on logits' device."""
    s = scale_logits(logits, inv_t)  # [B, V]
    tokens = torch.argmax(s + gumbel_noise(uniforms(seed, seq_keys, positions, s.shape[-1])), dim=-1)  # [B]
    return tokens, torch.log_softmax(s, dim=-1).gather(1, tokens[:, None]).squeeze(1)


# ---------------------------------------------------------------------------------------------
# Kernel
# ---------------------------------------------------------------------------------------------

def _launch(logits, seq_keys, positions, inv_t, seed_lo, seed_hi):
    from trace_kernels.runtime import f32, i32, kernel_for, ptr, u32
    device = check_cuda_device(logits)
    rows, vocab = logits.shape
    tokens = new_output((rows,), torch.int64, logits.device)
    logprobs = new_output((rows,), torch.float32, logits.device)
    if rows:
        spec = codegen_gumbel.spec(logits.dtype)
        splits = codegen_gumbel.splits(vocab)
        partials = torch.empty(rows * splits * codegen_gumbel.PARTIAL_BYTES // 4, dtype=torch.float32,
                               device=logits.device)  # [B, splits] gumbel::Partial
        arrivals = torch.zeros(rows, dtype=torch.int32, device=logits.device)  # per call: no stale counts
        with nvtx.annotate("gumbel_max_sample"):
            kernel_for(spec).launch(device, (rows, splits), (spec.launch["threads"],),
                                    [ptr(logits), ptr(seq_keys), ptr(positions), f32(inv_t), u32(seed_lo),
                                     u32(seed_hi), i32(vocab), i32(splits), ptr(partials), ptr(arrivals),
                                     ptr(tokens), ptr(logprobs)])
    return tokens, logprobs


@torch.library.custom_op("trace_kernels::gumbel_max_sample", mutates_args=())
def gumbel_max_sample_op(logits: torch.Tensor, seq_keys: torch.Tensor, positions: torch.Tensor, inv_t: float,
                         seed_lo: int, seed_hi: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens int64 [B], log-probs float32 [B]); the seed as two 32-bit halves."""
    if logits.device.type == "cpu":
        return reference(logits, inv_t, seed_lo | (seed_hi << 32), seq_keys, positions)
    return _launch(logits, seq_keys, positions, inv_t, seed_lo, seed_hi)


@gumbel_max_sample_op.register_fake
def _(logits, seq_keys, positions, inv_t, seed_lo, seed_hi):
    rows = logits.shape[0]
    return logits.new_empty((rows,), dtype=torch.int64), logits.new_empty((rows,), dtype=torch.float32)


def validate(logits: torch.Tensor, seed: int, seq_keys: torch.Tensor, positions: torch.Tensor,
             temperature: float) -> None:
    check_tensor(logits, "logits", dtypes=KERNEL_DTYPES, dim=2, aligned=False)
    rows, vocab = logits.shape
    if vocab == 0 or vocab >= 2**31 or rows >= 2**31:
        raise ValueError(f"logits shape {tuple(logits.shape)}: need 1 <= V < 2**31 and B < 2**31")
    if codegen_gumbel.splits(vocab) > 65535:
        raise ValueError(f"logits: V={vocab} needs more than 65535 CTAs per row")
    for name, t in (("seq_keys", seq_keys), ("positions", positions)):
        check_tensor(t, name, dtypes=(torch.int64,), device=logits.device, dim=1, aligned=False)
        if t.shape[0] != rows:
            raise ValueError(f"{name} has {t.shape[0]} entries for {rows} rows of logits")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if not (isinstance(temperature, (int, float)) and 0 < temperature < float("inf")):
        raise ValueError(f"temperature must be a finite number > 0 (greedy is not sampled), got {temperature!r}")
    if inv_temperature(temperature) == float("inf"):
        raise ValueError(f"temperature {temperature!r} is below FP32's range (1 / T overflows)")


def gumbel_max_sample(logits: torch.Tensor, seed: int, seq_keys: torch.Tensor, positions: torch.Tensor,
                      temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of logits [B, V] (bf16/fp16/fp32) from softmax(logits / T), with noise
    keyed by (seed, seq_keys int64 [B], positions int64 [B]) -> (tokens int64 [B], log-probs
    float32 [B] of the tokens under log_softmax(logits / T)). CPU tensors run the reference."""
    validate(logits, seed, seq_keys, positions, temperature)
    seed &= (1 << 64) - 1
    return gumbel_max_sample_op(logits, seq_keys, positions, inv_temperature(temperature), seed & _M32, seed >> 32)
