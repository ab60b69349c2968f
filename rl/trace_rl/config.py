"""Model configuration (Hugging Face ``qwen3_moe`` config.json fields) and the presets.

``MoEConfig`` holds exactly the fields the model uses. ``MoEConfig.from_hf_dict(d)`` reads a
config.json dict: an unknown field, or a known field with a value this implementation does not
support (e.g. ``rope_scaling``, sliding windows, attention bias, an activation other than silu),
raises ``ConfigError`` naming the field. ``to_hf_dict()`` writes it back.

``load_preset(name)`` reads ``rl/configs/models.toml`` (presets ``tiny``, ``small``, ``bench``).
"""
from __future__ import annotations

import tomllib
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from trace_rl.paths import configs_dir

PRESETS_FILE = configs_dir() / "models.toml"


class ConfigError(ValueError):
    """A model config that this implementation cannot represent faithfully."""


@dataclass(slots=True)
class MoEConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    moe_intermediate_size: int
    num_experts: int
    num_experts_per_tok: int
    intermediate_size: int = 0  # dense-MLP layers only
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        positive = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "head_dim", "decoder_sparse_step",
                    "max_position_embeddings")
        for name in positive:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple "
                              f"of num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 16:
            raise ConfigError(f"head_dim ({self.head_dim}) must be a multiple of 16 (NVFP4 KV blocks)")
        if any(l < 0 or l >= self.num_hidden_layers for l in self.mlp_only_layers):
            raise ConfigError(f"mlp_only_layers {self.mlp_only_layers} out of range "
                              f"[0, {self.num_hidden_layers})")
        if self.moe_layers():
            if self.num_experts <= 0 or not 0 < self.num_experts_per_tok <= self.num_experts:
                raise ConfigError(f"need 0 < num_experts_per_tok ({self.num_experts_per_tok}) <= "
                                  f"num_experts ({self.num_experts})")
            for name in ("hidden_size", "moe_intermediate_size"):
                if getattr(self, name) % 16:
                    raise ConfigError(f"{name} ({getattr(self, name)}) must be a multiple of 16 "
                                      f"(NVFP4 blocks along the expert GEMM reduction dim)")
        if len(self.moe_layers()) < self.num_hidden_layers and self.intermediate_size <= 0:
            raise ConfigError("intermediate_size must be positive when some layers are dense MLPs")
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise ConfigError("rms_norm_eps and rope_theta must be positive")

    def is_moe_layer(self, layer: int) -> bool:
        return (layer not in self.mlp_only_layers and self.num_experts > 0
                and (layer + 1) % self.decoder_sparse_step == 0)

    def moe_layers(self) -> list[int]:
        return [l for l in range(self.num_hidden_layers) if self.is_moe_layer(l)]

    # ------------------------------------------------------------------ Hugging Face config.json
    @classmethod
    def from_hf_dict(cls, d: dict) -> "MoEConfig":
        d = dict(d)
        model_type = d.pop("model_type", None)
        if model_type != "qwen3_moe":
            raise ConfigError(f"model_type must be 'qwen3_moe', got {model_type!r}")
        for key, ok, why in _HF_MUST_BE:
            if key in d:
                v = d.pop(key)
                if not ok(v):
                    raise ConfigError(f"unsupported config value {key}={v!r} ({why})")
        for key in _HF_IGNORED:
            d.pop(key, None)
        rope = d.pop("rope_parameters", None)
        if rope is not None:
            if rope.get("rope_type", "default") != "default" or set(rope) - {"rope_type", "rope_theta"}:
                raise ConfigError(f"unsupported config value rope_parameters={rope!r} (plain RoPE only)")
            d.setdefault("rope_theta", rope.get("rope_theta", 1_000_000.0))
        if "head_dim" not in d and "hidden_size" in d and "num_attention_heads" in d:
            d["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown config field(s) {unknown} for qwen3_moe")
        missing = [f.name for f in fields(cls) if f.name not in d
                   and f.default is MISSING and f.default_factory is MISSING]
        if missing:
            raise ConfigError(f"config is missing required field(s) {missing}")
        if isinstance(d.get("eos_token_id"), list):
            d["eos_token_id"] = d["eos_token_id"][0] if d["eos_token_id"] else None
        return cls(**d)

    def to_hf_dict(self) -> dict:
        d = asdict(self)
        d.update(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], hidden_act="silu",
                 rope_scaling=None, attention_bias=False, attention_dropout=0.0,
                 use_sliding_window=False)
        return d


# Fields accepted only with the one value this implementation computes.
_HF_MUST_BE = [
    ("hidden_act", lambda v: v == "silu", "only silu SwiGLU is implemented"),
    ("rope_scaling", lambda v: v is None, "RoPE scaling is not implemented"),
    ("use_sliding_window", lambda v: not v, "sliding-window attention is not implemented"),
    ("attention_bias", lambda v: not v, "q/k/v/o projection biases are not implemented"),
    ("attention_dropout", lambda v: v == 0, "dropout is not implemented"),
    ("layer_types", lambda v: all(t == "full_attention" for t in v), "full attention only"),
    ("output_router_logits", lambda v: not v, "router aux loss is not implemented"),
]
# Fields that do not change the computation.
_HF_IGNORED = ("architectures", "transformers_version", "torch_dtype", "dtype", "use_cache",
               "router_aux_loss_coef", "sliding_window", "max_window_layers")


def load_preset(name: str, path: str | Path = PRESETS_FILE) -> MoEConfig:
    """The preset ``name`` of models.toml as a MoEConfig."""
    with open(path, "rb") as f:
        presets = tomllib.load(f)
    if name not in presets:
        raise ConfigError(f"unknown model preset {name!r}; available: {sorted(presets)} ({path})")
    d = dict(presets[name])
    d.pop("description", None)
    try:
        return MoEConfig(**d)
    except TypeError as e:
        raise ConfigError(f"preset {name!r} in {path}: {e}") from None
