"""Engine and sampling configuration (slotted dataclasses, validated on construction)."""
from __future__ import annotations

from dataclasses import dataclass, field

BACKENDS = ("auto", "reference", "kernels", "kernels_emulated")


@dataclass(slots=True)
class EngineConfig:
    """Sizes of the paged KV cache and of a step.

    block_size: tokens per KV page (P). max_num_seqs: sequences decoded together.
    max_model_len: longest prompt + output (default: the model's max_position_embeddings); every
    step attends over this many key slots (padding masked), which keeps a sequence's numerics
    independent of its batch-mates, so set it to what the task needs.
    num_blocks: KV pages per layer (default: enough for max_num_seqs sequences of max_model_len,
    plus the scratch page 0 that padded CUDA-graph rows write into).
    max_num_batched_tokens: prompt tokens per prefill step. cuda_graphs: capture the decode step
    in CUDA graphs (one per batch-size bucket) on CUDA devices; False runs it eagerly.
    backend (nvfp4 mode): "auto" = the fused NVFP4 kernels on an sm_90 GPU with a BF16 model whose
    shapes they support, else "reference" (``trace_kernels.nvfp4`` fake quantization, the CPU path);
    "kernels" forces the kernel path (on CPU tensors its ops run their references);
    "kernels_emulated" runs the kernels' exact semantics with torch reference ops (for tests).
    kv_kernels: steps with one new token per sequence (decode) append K/V and attend with the
    paged-KV kernels (trace_kernels.kv_append, attention.decode_attention) when they take the
    model's attention shapes: NVFP4 pages on the kernels backends, BF16 pages in bf16 mode on an
    sm_90 GPU with a BF16 model; False: torch paged attention (nvfp4: after the quantize kernel).
    guidance_host_gb: the most page-locked host memory that guidance capture (kernels backend on
    CUDA) may hold for one ``generate`` call (None: half of the host's physical memory). A call
    whose worst case (every sequence reaching its token budget) needs more raises ValueError
    before any work, instead of running out of host memory midway. The finalized tables take as
    much again in plain host memory (one sorted buffer, reused by the next batch once released).
    guidance_copy_mb_per_step: how much queued guidance each step sends to the host (the rest waits
    on the device, up to 1 GiB, for later steps or the end of the batch): paces the prefill's
    guidance so that it does not hold up the decode steps' token read-backs.
    """

    block_size: int = 16
    max_num_seqs: int = 64
    max_model_len: int | None = None
    num_blocks: int | None = None
    max_num_batched_tokens: int = 8192
    cuda_graphs: bool = True
    backend: str = "auto"
    kv_kernels: bool = True
    guidance_host_gb: float | None = None
    guidance_copy_mb_per_step: int = 32

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"EngineConfig.backend must be one of {BACKENDS}, got {self.backend!r}")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "guidance_copy_mb_per_step"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"EngineConfig.{name} must be a positive integer, got {v!r}")
        for name in ("max_model_len", "num_blocks"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v <= 0):
                raise ValueError(f"EngineConfig.{name} must be a positive integer or None, got {v!r}")
        if self.guidance_host_gb is not None and not self.guidance_host_gb > 0:
            raise ValueError(f"EngineConfig.guidance_host_gb must be > 0 or None, got {self.guidance_host_gb!r}")


@dataclass(slots=True)
class SamplingParams:
    """temperature 0 = greedy (log-prob 0: the sampling distribution is a point mass);
    top_k 0 = off; top_p 1.0 = off. stop_token_ids end a sequence (the stop token is kept in
    output_ids); ignore_eos=False adds the model's eos_token_id to them."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        self.stop_token_ids = tuple(int(t) for t in self.stop_token_ids)
