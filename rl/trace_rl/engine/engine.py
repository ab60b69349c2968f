"""``RolloutEngine``: batched generation with a paged KV cache, in bf16 or nvfp4 mode, with
TRACE guidance capture; ``refit`` re-quantizes expert weights in place after a trainer update."""
from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from trace_rl.engine.block_manager import BlockManager
from trace_rl.engine.config import EngineConfig, SamplingParams
from trace_rl.engine.guidance_capture import AsyncGuidanceCapture
from trace_rl.engine.kernel_layout import GuidanceLayout, kernel_support, kv_kernel_support
from trace_rl.engine.kernel_moe import PackedExperts
from trace_rl.engine.kv_cache import PagedKVCache
from trace_rl.engine.model_runner import KERNEL_BACKENDS, ModelRunner
from trace_rl.engine.ranges import nvtx_range
from trace_rl.engine.sampler import sample
from trace_rl.engine.scheduler import Scheduler
from trace_rl.engine.sequence import Sequence, Status
from trace_rl.guidance_store import GuidanceBatch
from trace_rl.quant import GUIDANCE_MODES, GuidanceRecorder, fake_quantize_experts

MODES = ("bf16", "nvfp4")
CAPTURE = ("off",) + GUIDANCE_MODES


@dataclass
class SampleOutput:
    seq_id: int
    prompt_index: int  # which prompt of the generate call
    sample_index: int  # which of its group_size samples
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: Tensor  # float32 [len(output_ids)]
    finish_reason: str  # "stop" | "length"
    routing: list[Tensor]  # per MoE layer int16 [len(prompt) + len(output), k]; last row -1


@dataclass
class RolloutBatch:
    samples: list[SampleOutput]
    guidance: GuidanceBatch | None = None
    stats: dict = field(default_factory=dict)

    @property
    def routing(self) -> dict[int, list[Tensor]]:
        return {s.seq_id: s.routing for s in self.samples}


class _RoutingLog:
    """Expert ids of every forwarded token, kept on device until the batch ends."""

    def __init__(self):
        self.steps: list[tuple[Tensor, Tensor, list[Tensor]]] = []

    def add(self, seq_ids: Tensor, positions: Tensor, topk: list[Tensor]) -> None:
        self.steps.append((seq_ids, positions, [t.to(torch.int16) for t in topk]))

    def per_sequence(self, seqs: list[Sequence], num_layers: int, k: int) -> dict[int, list[Tensor]]:
        out = {s.seq_id: [torch.full((len(s), k), -1, dtype=torch.int16) for _ in range(num_layers)]
               for s in seqs}
        if not self.steps or num_layers == 0:
            return out
        sid = torch.cat([s[0] for s in self.steps]).cpu()
        pos = torch.cat([s[1] for s in self.steps]).cpu()
        layers = [torch.cat([s[2][l] for s in self.steps]).cpu() for l in range(num_layers)]
        order = torch.argsort(sid, stable=True)
        sid, pos = sid[order], pos[order]
        bounds = torch.searchsorted(sid, torch.tensor(sorted(out)), right=False).tolist() + [len(sid)]
        for i, seq_id in enumerate(sorted(out)):
            rows = order[bounds[i]:bounds[i + 1]]
            p = pos[bounds[i]:bounds[i + 1]]
            for l in range(num_layers):
                out[seq_id][l][p] = layers[l][rows]
        return out


def new_step_stats() -> dict:
    """The per-call counters ``_step`` adds to (seconds and tokens of prefill and decode, each
    decode step's seconds in order, and the host seconds spent queueing and issuing guidance copies)."""
    return {"prefill_s": 0.0, "decode_s": 0.0, "decode_steps": 0, "prefill_tokens": 0, "decode_tokens": 0,
            "decode_step_s": [], "capture_host_s": 0.0}


def guidance_host_limit(config: EngineConfig) -> int:
    """Bytes of pinned host memory guidance capture may hold per generate call."""
    if config.guidance_host_gb is not None:
        return int(config.guidance_host_gb * 2**30)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def _on_hopper(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


def resolve_backend(requested: str, mode: str, config, dtype: torch.dtype, device: torch.device) -> str:
    """EngineConfig.backend -> the backend that runs: "reference" | "kernels" | "kernels_emulated"."""
    if mode == "bf16":
        if requested in KERNEL_BACKENDS:
            raise ValueError(f"backend {requested!r} is the nvfp4 kernel path; mode is 'bf16'")
        return "reference"
    reason = kernel_support(config, dtype)
    if requested == "auto":
        return "kernels" if reason is None and _on_hopper(device) else "reference"
    if requested in KERNEL_BACKENDS and reason is not None:
        raise ValueError(f"backend {requested!r} cannot run this model: {reason}")
    return requested


class RolloutEngine:
    """Generation engine. It keeps its own copy of the model, so the trainer's weights are never
    touched; ``refit`` copies new weights in. In nvfp4 mode the routed experts are NVFP4: on the
    ``reference`` backend as fake-quantized weights in the model's own tensors, on the ``kernels``
    backend as packed NVFP4 buffers (``engine.packed``) that the fused MoE GEMMs read.

    RolloutEngine(model, config=None, mode="bf16"|"nvfp4", capture="off"|"compact"|"full",
                  device=None, dtype=None)
    generate(prompts: list[list[int]], sampling: SamplingParams, group_size: int = 1,
             seed: int = 0) -> RolloutBatch
    refit(state_dict_or_model) -> float (seconds); details in ``engine.last_refit``
    engine.backend: the backend that runs ("reference" | "kernels" | "kernels_emulated")
    """

    def __init__(self, model, config: EngineConfig | None = None, mode: str = "bf16",
                 capture: str = "off", device=None, dtype: torch.dtype | None = None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if capture not in CAPTURE:
            raise ValueError(f"capture must be one of {CAPTURE}, got {capture!r}")
        if capture != "off" and mode != "nvfp4":
            raise ValueError("guidance capture needs mode='nvfp4' (bf16 rollouts quantize nothing)")
        self.config = config or EngineConfig()
        self.mode, self.capture = mode, capture
        p0 = next(model.parameters())
        self.device = torch.device(device) if device is not None else p0.device
        self.dtype = dtype or p0.dtype
        self.model = copy.deepcopy(model).to(device=self.device, dtype=self.dtype).eval()
        self.model.requires_grad_(False).zero_grad(set_to_none=True)  # no copied gradients
        mc = self.model.config
        self.backend = resolve_backend(self.config.backend, mode, mc, self.dtype, self.device)
        self.packed = PackedExperts(self.model, self.device) if self.backend in KERNEL_BACKENDS else None
        self.last_refit: dict = {}
        if mode == "nvfp4":  # quantize experts from the source tensors, exactly as refit does
            self.refit(model)
        self.max_model_len = self.config.max_model_len or mc.max_position_embeddings
        P = self.config.block_size
        self.max_blocks_per_seq = -(-self.max_model_len // P)
        num_blocks = self.config.num_blocks or self.config.max_num_seqs * self.max_blocks_per_seq + 1
        self.blocks = BlockManager(num_blocks, P)
        self.cache = PagedKVCache(mc.num_hidden_layers, num_blocks, P, mc.num_key_value_heads,
                                  mc.head_dim, self.dtype, self.device, quantized=(mode == "nvfp4"))
        kernels = self.backend in KERNEL_BACKENDS
        self.recorder = GuidanceRecorder(capture) if capture != "off" and not kernels else None
        layout = GuidanceLayout(mc, capture) if capture != "off" and kernels else None
        self.guidance_limit_bytes = guidance_host_limit(self.config)
        self.guidance_capture = (AsyncGuidanceCapture(layout, self.device, self.guidance_limit_bytes,
                                                      copy_bytes_per_step=self.config.guidance_copy_mb_per_step << 20)
                                 if layout else None)
        self.kv_kernels = self.config.kv_kernels and (
            kv_kernel_support(mc, P) is None if kernels
            else (mode == "bf16" and self.dtype == torch.bfloat16 and _on_hopper(self.device)
                  and kv_kernel_support(mc, P, "bf16") is None))
        self.runner = ModelRunner(self.model, self.cache, self.blocks, mode, self.recorder,
                                  self.device, self.config.cuda_graphs, self.config.max_num_seqs,
                                  self.max_blocks_per_seq, self.backend, self.packed, layout,
                                  self.kv_kernels)
        self._next_seq_id = 0

    # ------------------------------------------------------------------ weights
    @torch.no_grad()
    def refit(self, weights) -> float:
        """Copy new weights (a state dict with the model's own names, or a model) into the engine's
        tensors in place (addresses stay stable). In nvfp4 mode routed-expert weights are NVFP4
        quantized from the source tensor (one FP32 scale per expert), exactly as the trainer's
        ``expert_w`` site quantizes them: fake-quantized into the model's tensors (reference
        backend) or by ``ops.refit_weights_packed_`` straight into the packed buffers the MoE GEMMs
        read (kernels backend). Returns the seconds taken (device work included); ``last_refit`` has
        them with the quantization's own seconds and GB/s over the engine's BF16 expert bytes."""
        with nvtx_range("rollout/refit"):
            start = time.perf_counter()
            state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
            experts = {n for n, _ in self.model.expert_parameters()}
            packed_src = []
            for name, p in self.model.named_parameters():
                if name not in state:
                    raise KeyError(f"refit: weight {name!r} is missing from the new weights")
                src = state[name].detach()
                if src.shape != p.shape:
                    raise ValueError(f"refit: weight {name!r} has shape {tuple(src.shape)}, "
                                     f"expected {tuple(p.shape)}")
                src = src.to(self.device, non_blocking=True)
                if self.packed is not None and name in self.packed.param_site:
                    packed_src.append((name, src))  # quantized below; p keeps the BF16 source copy
                elif self.mode == "nvfp4" and name in experts:
                    src = fake_quantize_experts(src)
                p.copy_(src)
            quant_s = self._refit_packed(packed_src) if packed_src else None
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            seconds = time.perf_counter() - start
            nbytes = self.expert_bytes()
            self.last_refit = {"seconds": seconds, "expert_bytes": nbytes}
            if quant_s is not None:
                self.last_refit.update(quantize_seconds=quant_s(),
                                       quantize_gb_per_s=nbytes / 1e9 / max(quant_s(), 1e-12))
            return seconds

    def _refit_packed(self, sources):
        """refit_weights_packed_ (quantization into the packed layout, one op) for every packed expert
        tensor; returns a callable giving the seconds they took (CUDA events, read after the caller's sync)."""
        cuda = self.device.type == "cuda"
        if cuda:
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
        wall = time.perf_counter()
        for name, src in sources:
            layer, which = self.packed.param_site[name]
            self.packed.refit(layer, which, src)
        if cuda:
            t1.record()
            return lambda: t0.elapsed_time(t1) / 1e3
        wall = time.perf_counter() - wall
        return lambda: wall

    def _step(self, scheduler: Scheduler, sampling: SamplingParams, seed: int, stop: set[int],
              routing: _RoutingLog, stats: dict) -> None:
        batch, prefill = scheduler.schedule()
        t0 = time.perf_counter()
        capture = self.guidance_capture
        with nvtx_range("rollout/prefill" if prefill else "rollout/decode_step"):
            # sampling keys, uploaded before the forward is queued: a blocking copy after it would
            # wait for the whole forward (a second host sync per step)
            keys = torch.tensor([s.rng_key for s in batch]).to(self.device, non_blocking=True)
            positions = torch.tensor([len(s) for s in batch]).to(self.device, non_blocking=True)
            logits, topk, x, arena = self.runner.run(batch, prefill)
            routing.add(x.seq_ids, x.positions, topk)
            if capture is not None:  # earlier steps' guidance to the host while this step computes
                t_host = time.perf_counter()
                capture.issue_step()
                if arena is not None:  # sent next step: its copy must not sit before this step's read-back
                    capture.enqueue(arena, x.seq_ids_cpu, x.positions_cpu, reused=self.runner.last_step_graphed)
                stats["capture_host_s"] += time.perf_counter() - t_host
            tokens, logprobs = sample(logits, sampling, seed, keys, positions)
            tokens, logprobs = tokens.tolist(), logprobs.float().tolist()  # the step's one sync
        for s, t, lp in zip(batch, tokens, logprobs):
            s.append(t, lp)
            if t in stop:
                s.finish("stop")
            elif len(s) >= s.max_tokens:
                s.finish("length")
            if s.status is Status.FINISHED:
                scheduler.retire(s)
        dt = time.perf_counter() - t0
        if prefill:
            stats["prefill_s"] += dt
            stats["prefill_tokens"] += int(x.token_ids.numel())
        else:
            stats["decode_s"] += dt
            stats["decode_step_s"].append(dt)
            stats["decode_steps"] += 1
            stats["decode_tokens"] += len(batch)

    def expert_bytes(self) -> int:
        """Bytes of the engine's (BF16) routed-expert weights: what refit re-quantizes."""
        return sum(p.numel() * p.element_size() for _, p in self.model.expert_parameters())

    # ------------------------------------------------------------------ generation
    def guidance_bytes_for(self, tokens: int) -> int:
        """Host bytes of captured guidance for ``tokens`` forwarded tokens (0 without capture)."""
        if self.guidance_capture is None:
            return 0
        return tokens * self.guidance_capture.layout.bytes_per_token

    def reserve_guidance(self, tokens: int) -> None:
        """Page-lock host memory for ``tokens`` tokens of guidance now (it is kept across calls), so
        that no generate call pays for it inside its decode loop. A no-op without kernel capture."""
        if self.guidance_capture is not None:
            self._check_guidance_budget(tokens)
            # a prefill step packs prompts up to max_num_batched_tokens (a longer prompt goes alone, and
            # its arena may still page-lock a slab of its own), a decode step forwards max_num_seqs
            largest_step = max(self.config.max_num_batched_tokens, self.config.max_num_seqs)
            self.guidance_capture.reserve(tokens, largest_step)

    def _check_guidance_budget(self, tokens: int) -> None:
        need = self.guidance_bytes_for(tokens)
        if need > self.guidance_limit_bytes:
            raise ValueError(
                f"guidance capture for this call may need {need / 2**30:.1f} GiB of pinned host memory "
                f"({tokens} tokens x {self.guidance_capture.layout.bytes_per_token} B), more than the "
                f"{self.guidance_limit_bytes / 2**30:.1f} GiB limit (EngineConfig.guidance_host_gb): "
                f"split the batch, shorten max_new_tokens, or raise the limit")

    def _check_prompts(self, prompts, sampling: SamplingParams) -> None:
        V = self.model.config.vocab_size
        if not prompts:
            raise ValueError("generate needs at least one prompt")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty")
            if min(p) < 0 or max(p) >= V:
                raise ValueError(f"prompt {i} has token ids outside [0, {V})")
            if len(p) >= self.max_model_len:
                raise ValueError(f"prompt {i} has {len(p)} tokens; max_model_len is {self.max_model_len}")

    def generate(self, prompts: list[list[int]], sampling: SamplingParams, group_size: int = 1,
                 seed: int = 0) -> RolloutBatch:
        """G = group_size samples of each prompt. Sample j of prompt i draws from its own random
        stream keyed by (seed, i, j); its tokens depend on nothing else in the batch."""
        self._check_prompts(prompts, sampling)
        if not 0 < group_size < (1 << 20):
            raise ValueError(f"group_size must be in [1, 2**20), got {group_size}")
        stop = set(sampling.stop_token_ids)
        eos = self.model.config.eos_token_id
        if not sampling.ignore_eos and eos is not None:
            stop.add(eos)
        if self.guidance_capture is not None:  # worst case: every sequence uses its whole budget
            self._check_guidance_budget(group_size * sum(
                min(len(p) + sampling.max_new_tokens, self.max_model_len) for p in prompts))
        scheduler = Scheduler(self.config, self.blocks)
        seqs = []
        for i, p in enumerate(prompts):
            for j in range(group_size):
                budget = min(len(p) + sampling.max_new_tokens, self.max_model_len)
                seq = Sequence(self._next_seq_id, i, j, (i << 20) | j, p, budget)
                self._next_seq_id += 1
                scheduler.add(seq)
                seqs.append(seq)
        if self.recorder is not None:
            self.recorder.clear()
        if self.guidance_capture is not None:
            self.guidance_capture.clear()
        routing = _RoutingLog()
        stats = new_step_stats()
        try:
            while not scheduler.done:
                self._step(scheduler, sampling, seed, stop, routing, stats)
        finally:  # an error must not leak KV pages into the next call
            for s in list(scheduler.running):
                scheduler.retire(s)
        guidance = None
        sink = self.recorder if self.recorder is not None else self.guidance_capture
        if sink is not None:
            t0 = time.perf_counter()
            with nvtx_range("rollout/guidance_finalize"):
                guidance = sink.finalize()
                sink.clear()
            stats["guidance_finalize_s"] = time.perf_counter() - t0
            stats["guidance"] = guidance.stats()
        stats["backend"] = self.backend
        stats["kv_kernels"] = self.kv_kernels
        stats["cuda_graphs"] = self.runner.use_graphs
        mc = self.model.config
        per_seq = routing.per_sequence(seqs, len(self.model.moe_layers), mc.num_experts_per_tok)
        samples = [SampleOutput(s.seq_id, s.prompt_index, s.sample_index,
                                s.token_ids[:s.num_prompt], s.output_ids,
                                torch.tensor(s.logprobs, dtype=torch.float32), s.finish_reason,
                                per_seq[s.seq_id]) for s in seqs]
        return RolloutBatch(samples, guidance, stats)
