"""Model shape table: the presets kernels are generated for, plus custom shapes (CLI or HF config.json).

A shape lists the dimensions of one MoE transformer layer. Each op's codegen module
(trace_kernels.codegen.ops.*) turns a shape into the kernels that layer needs.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelShape:
    name: str
    experts: int  # E, routed experts per MoE layer
    hidden: int  # H
    intermediate: int  # I, per-expert FFN width (moe_intermediate_size)
    top_k: int
    q_heads: int
    kv_heads: int
    head_dim: int

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name != "name" and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"shape {self.name!r}: {field.name} must be a positive int, got {value!r}")
        for field in ("hidden", "intermediate", "head_dim"):
            if getattr(self, field) % 16:
                raise ValueError(f"shape {self.name!r}: {field}={getattr(self, field)} must be a multiple of 16 (NVFP4 blocks)")
        if self.top_k > self.experts:
            raise ValueError(f"shape {self.name!r}: top_k={self.top_k} exceeds experts={self.experts}")
        if self.q_heads % self.kv_heads:
            raise ValueError(f"shape {self.name!r}: q_heads={self.q_heads} is not a multiple of kv_heads={self.kv_heads}")

    def describe(self) -> str:
        return (f"{self.name}: E={self.experts} H={self.hidden} I={self.intermediate} top-{self.top_k} "
                f"heads {self.q_heads}q/{self.kv_heads}kv x {self.head_dim}")


PRESETS: dict[str, ModelShape] = {s.name: s for s in (
    # Small enough for CPU tests and quick compiles; still exercises several D values.
    ModelShape("tiny", experts=8, hidden=256, intermediate=128, top_k=2, q_heads=4, kv_heads=2, head_dim=64),
    ModelShape("qwen3-30b-a3b", experts=128, hidden=2048, intermediate=768, top_k=8, q_heads=32, kv_heads=4,
               head_dim=128),
    ModelShape("qwen3-235b-a22b", experts=128, hidden=4096, intermediate=1536, top_k=8, q_heads=64, kv_heads=4,
               head_dim=128),
)}

# Short keys accepted by parse_custom, and the HF config.json keys they come from.
_CUSTOM_KEYS = {"e": "experts", "h": "hidden", "i": "intermediate", "k": "top_k", "hq": "q_heads", "hkv": "kv_heads",
                "hd": "head_dim"}
# Where a config.json keeps each dimension, in the order looked up. Several families name them differently:
# ERNIE 4.5 (moe_num_experts, moe_k), Hunyuan (moe_topk, attention_head_dim), gpt-oss (experts_per_token), DBRX (d_model,
# n_heads, and experts, top-k, width and kv heads in its nested ffn_config / attn_config, which _flat_config lifts).
_HF_KEYS = {"experts": ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts"),
            "hidden": ("hidden_size", "d_model"),
            "intermediate": ("moe_intermediate_size", "intermediate_size", "ffn_hidden_size"),
            "top_k": ("num_experts_per_tok", "moe_topk", "moe_k", "experts_per_token", "moe_top_k"),
            "q_heads": ("num_attention_heads", "n_heads"), "kv_heads": ("num_key_value_heads", "kv_n_heads"),
            "head_dim": ("head_dim", "attention_head_dim")}
_NESTED_SECTIONS = ("ffn_config", "attn_config")  # DBRX
# Dense MLPs that sit beside the routed experts in some families; the MoE kernels cover the routed experts only.
_SHARED_EXPERT_KEYS = ("shared_expert_intermediate_size", "n_shared_experts", "moe_num_shared_experts",
                       "num_shared_expert")


def preset(name: str) -> ModelShape:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None


def parse_custom(text: str, name: str | None = None) -> ModelShape:
    """'E=128,H=2048,I=768,k=8,hq=32,hkv=4,hd=128' -> ModelShape (all seven keys required), named by its dimensions
    (e128_h2048_i768_k8_hq32_hkv4_d128) unless a name is given, so two custom shapes in one run stay apart."""
    values: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        field = _CUSTOM_KEYS.get(key.strip().lower())
        if not sep or field is None:
            raise ValueError(f"bad shape item {item!r}; expected KEY=INT with KEY in {sorted(_CUSTOM_KEYS)}")
        try:
            values[field] = int(value)
        except ValueError:
            raise ValueError(f"bad shape item {item!r}: {value!r} is not an integer") from None
    missing = sorted(k for k, f in _CUSTOM_KEYS.items() if f not in values)
    if missing:
        raise ValueError(f"custom shape {text!r} lacks {', '.join(missing)}")
    if name is None:
        name = "e{experts}_h{hidden}_i{intermediate}_k{top_k}_hq{q_heads}_hkv{kv_heads}_d{head_dim}".format(**values)
    return ModelShape(name=name, **values)


def _flat_config(path: Path) -> dict:
    """The language model's keys of a config.json: text_config's for multimodal configs, with DBRX's nested
    sections lifted (a top-level key wins over a nested one)."""
    config = json.loads(path.read_text())
    config = config.get("text_config", config)
    nested = {k: v for section in _NESTED_SECTIONS if isinstance(config.get(section), dict)
              for k, v in config[section].items()}
    return {**nested, **config}


def _layer_int(path: Path, key: str, value) -> int:
    """A config value as one int; a per-layer list (Hunyuan's moe_topk) must hold one value, since a shape is one
    layer's."""
    if isinstance(value, list):
        distinct = sorted(set(v for v in value if v is not None), key=str)
        if len(distinct) != 1:
            raise ValueError(f"{path}: {key} differs across layers ({distinct}); give one layer's shape with --shape")
        value = distinct[0]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{path}: {key} is {value!r}, not an integer")
    return value


def from_hf_config(path: str | Path, name: str | None = None) -> ModelShape:
    """Read a Hugging Face MoE config.json (Qwen3-MoE, Mixtral, DeepSeek, gpt-oss, ERNIE 4.5, Hunyuan, DBRX style
    keys)."""
    path = Path(path)
    config = _flat_config(path)
    if config.get("kv_lora_rank") is not None:  # DeepSeek-V2/V3, Kimi K2: a latent KV cache, not per-head K and V
        experts = next((config[k] for k in _HF_KEYS["experts"] if config.get(k) is not None), "E")
        raise ValueError(f"{path}: multi-head latent attention (kv_lora_rank {config['kv_lora_rank']}) has no per-head "
                         f"K/V cache for the attention kernels; for the MoE kernels alone give the shape, e.g. "
                         f"--shape E={experts},H={config.get('hidden_size', 'H')},"
                         f"I={config.get('moe_intermediate_size', 'I')},k={config.get('num_experts_per_tok', 'k')},"
                         f"hq=1,hkv=1,hd=128 --op moe_gemm (the heads do not change the MoE kernels)")
    values: dict[str, int] = {}
    for field, keys in _HF_KEYS.items():
        key = next((k for k in keys if config.get(k) is not None), None)
        if key is not None:
            values[field] = _layer_int(path, key, config[key])
        elif field == "head_dim" and "hidden" in values and "q_heads" in values:
            values[field] = values["hidden"] // values["q_heads"]
        elif field == "kv_heads" and "q_heads" in values:
            values[field] = values["q_heads"]  # no key: multi-head attention
        else:
            raise ValueError(f"{path}: no {' / '.join(keys)} key; is this an MoE model config?")
    return ModelShape(name=name or config.get("model_type", path.parent.name or "custom"), **values)


def shared_experts(path: str | Path) -> str | None:
    """'key=value' of a config's shared experts (dense MLPs beside the routed ones, which the MoE kernels do not
    cover), or None when it has none."""
    path = Path(path)
    config = _flat_config(path)
    found = [f"{k}={config[k]}" for k in _SHARED_EXPERT_KEYS if config.get(k) not in (None, 0, [])]
    return ", ".join(found) or None


def resolve(spec: str) -> ModelShape:
    """A preset name, a path to config.json, or a custom 'E=..,H=..' string."""
    if spec in PRESETS:
        return PRESETS[spec]
    if spec.endswith(".json") or Path(spec).is_file():
        return from_hf_config(spec)
    if "=" in spec:
        return parse_custom(spec)
    raise ValueError(f"{spec!r} is neither a preset ({', '.join(PRESETS)}), a config.json nor 'E=..,H=..,...'")
