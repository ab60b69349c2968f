"""The Qwen3-MoE policy model. See ``trace_rl.model.qwen3_moe`` for the forward contract."""
from trace_rl.config import MoEConfig
from trace_rl.model.layers import AttentionMask, DenseAttention, masked_attention
from trace_rl.model.moe import grouped_linear, route, sort_by_expert
from trace_rl.model.qwen3_moe import MoEForCausalLM, ModelOutput

__all__ = ["MoEConfig", "MoEForCausalLM", "ModelOutput", "AttentionMask", "DenseAttention", "masked_attention",
           "grouped_linear", "route", "sort_by_expert"]
