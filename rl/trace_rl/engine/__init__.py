"""The rollout engine (nano-vllm style, split by role).

- ``config``: ``EngineConfig`` (KV page size, batch limits, cache size, CUDA graphs) and
  ``SamplingParams`` (temperature, top_p, top_k, max_new_tokens, stop_token_ids, ignore_eos).
- ``sequence`` / ``block_manager`` / ``scheduler``: sequences, KV page allocation (whole budget
  reserved at admission: no preemption), prefill-then-decode scheduling.
- ``kv_cache``: BF16 or NVFP4 KV pages and the paged attention backend.
- ``model_runner``: one step through the model; the step's quantizer; CUDA-graph decode.
- ``kernel_moe`` / ``kernel_layout`` / ``guidance_capture``: the nvfp4 ``kernels`` backend (packed
  NVFP4 experts and refit, fused MoE GEMMs, K/V quantize kernel, guidance arena -> pinned host).
- ``sampler``: counter-based per-sequence randomness, Gumbel-max sampling, sampling log-probs.
- ``engine``: ``RolloutEngine``, ``RolloutBatch``, ``SampleOutput``.

API::

    engine = RolloutEngine(model, EngineConfig(..., cuda_graphs=True, backend="auto"),
                           mode="bf16"|"nvfp4",
                           capture="off"|"compact"|"full", device=None, dtype=None)
    batch = engine.generate(prompts: list[list[int]], SamplingParams(...), group_size=G, seed=0)
    batch.samples[i]: seq_id, prompt_index, sample_index, prompt_ids, output_ids,
                      logprobs float32 [n_out], finish_reason "stop"|"length",
                      routing (per MoE layer int16 [n_prompt + n_out, k]; the last token, never
                      forwarded, is -1)
    batch.guidance: GuidanceBatch | None (capture on); batch.stats: timings, token counts, guidance
    seconds = engine.refit(model_or_state_dict)   # details: engine.last_refit
"""
from trace_rl.engine.config import EngineConfig, SamplingParams
from trace_rl.engine.engine import RolloutBatch, RolloutEngine, SampleOutput

__all__ = ["EngineConfig", "SamplingParams", "RolloutEngine", "RolloutBatch", "SampleOutput"]
