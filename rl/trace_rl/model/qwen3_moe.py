"""Qwen3-MoE causal LM (``MoEForCausalLM``).

Public forward::

    model(input_ids [B, T], *, quant=None, seq_ids=None [B], positions=None [B, T],
          attention_mask=None [B, T], forced_experts=None) -> ModelOutput

- ``attention_mask`` 1 = real token (any padding pattern; attention is causal in column order
  among a row's real tokens). Default positions: the count of real tokens before each one.
- ``seq_ids`` default ``arange(B)``; they and ``positions`` form the ``TokenIndex`` given to ``quant``.
- ``forced_experts``: list (one per MoE layer, in layer order) of int64 [B, T, k] (routing replay);
  a token whose row holds -1 is routed by the router (as the rollout's routing marks its last token).
- ``ModelOutput.logits`` [B, T, V] (padding positions are 0); ``.router_topk``: list per MoE layer
  of int64 [B, T, k] (padding positions are -1).

Engine-facing core: ``forward_tokens(token_ids [N], positions [N], backend, quant, index, forced)``
-> (final-normed hidden [N, H], list of experts [N, k]) and ``logits(hidden) -> [N, V]``.
Checkpoints: ``from_pretrained(path, dtype=...)`` / ``save_pretrained(path)`` (see trace_rl.checkpoint).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from trace_rl.config import MoEConfig
from trace_rl.model.layers import Attention, DenseAttention, DenseMLP, RMSNorm, rope_cos_sin
from trace_rl.model.moe import SparseMoeBlock
from trace_rl.quant import TokenIndex


@dataclass
class ModelOutput:
    logits: Tensor  # [B, T, V]
    router_topk: list[Tensor]  # per MoE layer, int64 [B, T, k]


class DecoderLayer(nn.Module):
    def __init__(self, config: MoEConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.is_moe = config.is_moe_layer(layer)
        self.mlp = (SparseMoeBlock(config, layer) if self.is_moe
                    else DenseMLP(config.hidden_size, config.intermediate_size))

    def forward(self, h: Tensor, rope, backend, quant, index, forced):
        h = h + self.self_attn(self.input_layernorm(h), rope, backend, quant, index)
        x = self.post_attention_layernorm(h)
        if self.is_moe:
            y, experts = self.mlp(x, quant, index, forced)
            return h + y, experts
        return h + self.mlp(x), None


class MoEModel(nn.Module):
    def __init__(self, config: MoEConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, l) for l in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class MoEForCausalLM(nn.Module):
    def __init__(self, config: MoEConfig):
        super().__init__()
        config.validate()
        self.config = config
        self.model = MoEModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.moe_layers = config.moe_layers()
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> "MoEForCausalLM":
        """Normal(0, initializer_range) for matrices and embeddings, ones for norms, drawn on each
        parameter's device (a seed gives the same weights on the same device type)."""
        gens = {}
        std = self.config.initializer_range
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
                continue
            gen = None
            if seed is not None:
                gen = gens.get(p.device) or gens.setdefault(
                    p.device, torch.Generator(device=p.device).manual_seed(seed))
            p.copy_(torch.randn(p.shape, generator=gen, device=p.device) * std)
        return self

    # ------------------------------------------------------------------------ core
    def forward_tokens(self, token_ids: Tensor, positions: Tensor, backend, quant=None,
                       index: TokenIndex | None = None, forced: list[Tensor] | None = None):
        """Flat tokens int64 [N] -> (hidden after the final norm [N, H], experts per MoE layer [N, k])."""
        if forced is not None and len(forced) != len(self.moe_layers):
            raise ValueError(f"forced_experts has {len(forced)} entries; the model has "
                             f"{len(self.moe_layers)} MoE layers")
        h = self.model.embed_tokens(token_ids)  # [N, H]
        c = self.config
        rope = rope_cos_sin(positions, c.head_dim, c.rope_theta, h.dtype)  # cos, sin [N, D]
        topk, m = [], 0
        for layer in self.model.layers:
            f = forced[m] if (forced is not None and layer.is_moe) else None
            h, experts = layer(h, rope, backend, quant, index, f)
            if experts is not None:
                topk.append(experts)
                m += 1
        return self.model.norm(h), topk

    def logits(self, hidden: Tensor) -> Tensor:
        return self.lm_head(hidden)  # [N, V]

    # ------------------------------------------------------------------------ public forward
    def forward(self, input_ids: Tensor, *, quant=None, seq_ids: Tensor | None = None,
                positions: Tensor | None = None, attention_mask: Tensor | None = None,
                forced_experts: list[Tensor] | None = None) -> ModelOutput:
        if input_ids.dim() != 2 or input_ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"input_ids must be an integer tensor [B, T], got "
                             f"{tuple(input_ids.shape)} {input_ids.dtype}")
        B, T = input_ids.shape
        dev = input_ids.device
        if attention_mask is None:
            real = torch.ones(B, T, dtype=torch.bool, device=dev)
        else:
            if attention_mask.shape != (B, T):
                raise ValueError(f"attention_mask {tuple(attention_mask.shape)} != input_ids {(B, T)}")
            real = attention_mask.bool()
        b_idx, t_idx = real.nonzero(as_tuple=True)  # [N] each, row-major
        if positions is None:
            positions = real.long().cumsum(dim=1) - 1
        elif positions.shape != (B, T):
            raise ValueError(f"positions {tuple(positions.shape)} != input_ids {(B, T)}")
        if seq_ids is None:
            seq_ids = torch.arange(B, device=dev)
        elif seq_ids.shape != (B,):
            raise ValueError(f"seq_ids must have shape {(B,)}, got {tuple(seq_ids.shape)}")
        tokens = input_ids[b_idx, t_idx].long()
        if ((tokens < 0) | (tokens >= self.config.vocab_size)).any():
            raise ValueError(f"input_ids contain ids outside [0, {self.config.vocab_size})")
        pos = positions[b_idx, t_idx].long()
        index = TokenIndex(seq_ids.long()[b_idx], pos)
        forced = None
        if forced_experts is not None:
            k = self.config.num_experts_per_tok
            for i, f in enumerate(forced_experts):
                if f.shape != (B, T, k):
                    raise ValueError(f"forced_experts[{i}] has shape {tuple(f.shape)}, expected {(B, T, k)}")
            forced = [f[b_idx, t_idx] for f in forced_experts]
            for i, f in enumerate(forced):
                if ((f < -1) | (f >= self.config.num_experts)).any():
                    raise ValueError(f"forced_experts[{i}] has expert ids outside "
                                     f"[-1, {self.config.num_experts}) at real tokens")
        hidden, topk = self.forward_tokens(tokens, pos, DenseAttention(b_idx, t_idx, B, T),
                                           quant, index, forced)
        flat = self.logits(hidden)  # [N, V]
        logits = flat.new_zeros(B, T, flat.shape[-1])
        logits[b_idx, t_idx] = flat
        router = []
        for e in topk:
            full = torch.full((B, T, e.shape[-1]), -1, dtype=torch.int64, device=dev)
            full[b_idx, t_idx] = e
            router.append(full)
        return ModelOutput(logits=logits, router_topk=router)

    # ------------------------------------------------------------------------ checkpoints
    @classmethod
    def from_pretrained(cls, path, dtype: torch.dtype = torch.bfloat16, device="cpu") -> "MoEForCausalLM":
        from trace_rl.checkpoint import load_pretrained
        return load_pretrained(path, dtype=dtype, device=device)

    def save_pretrained(self, path, max_shard_bytes: int | None = None) -> None:
        from trace_rl.checkpoint import save_pretrained
        save_pretrained(self, path, max_shard_bytes=max_shard_bytes)

    @classmethod
    def from_preset(cls, name: str, seed: int = 0, dtype: torch.dtype = torch.float32,
                    device="cpu") -> "MoEForCausalLM":
        from trace_rl.config import load_preset
        return cls(load_preset(name)).init_weights(seed).to(dtype=dtype, device=device)

    def expert_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """(name, parameter) of every stacked routed-expert weight (what NVFP4 refit quantizes)."""
        return [(n, p) for n, p in self.named_parameters() if n.endswith((".w_gate_up", ".w_down"))]
