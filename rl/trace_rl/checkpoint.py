"""Hugging Face ``qwen3_moe`` checkpoint I/O for ``MoEForCausalLM``.

Layout read and written: ``config.json`` (``MoEConfig.to_hf_dict`` plus ``torch_dtype``) and either
``model.safetensors`` or shards ``model-0000i-of-0000n.safetensors`` with
``model.safetensors.index.json`` (``{"metadata": {"total_size"}, "weight_map": {key: file}}``).
Per-expert keys ``model.layers.L.mlp.experts.J.{gate,up,down}_proj.weight`` are stacked into the
model's ``w_gate_up`` [E, 2I, H] / ``w_down`` [E, H, I] on load and split again on save. Missing,
unexpected or mis-shaped tensors raise ``CheckpointError`` naming the key. A tied model may carry an
``lm_head.weight`` equal to the embeddings; any other value is an error.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from trace_rl.config import MoEConfig

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_EXPERT_KEY = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


class CheckpointError(ValueError):
    """A checkpoint directory that does not match the model it describes."""


def _expected_hf_shapes(config: MoEConfig) -> dict[str, tuple[int, ...]]:
    c = config
    H, D, I = c.hidden_size, c.head_dim, c.moe_intermediate_size
    shapes = {"model.embed_tokens.weight": (c.vocab_size, H), "model.norm.weight": (H,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, H)
    for l in range(c.num_hidden_layers):
        p = f"model.layers.{l}."
        shapes.update({
            p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
            p + "self_attn.q_proj.weight": (c.num_attention_heads * D, H),
            p + "self_attn.k_proj.weight": (c.num_key_value_heads * D, H),
            p + "self_attn.v_proj.weight": (c.num_key_value_heads * D, H),
            p + "self_attn.o_proj.weight": (H, c.num_attention_heads * D),
            p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,)})
        if c.is_moe_layer(l):
            shapes[p + "mlp.gate.weight"] = (c.num_experts, H)
            for j in range(c.num_experts):
                q = f"{p}mlp.experts.{j}."
                shapes.update({q + "gate_proj.weight": (I, H), q + "up_proj.weight": (I, H),
                               q + "down_proj.weight": (H, I)})
        else:
            shapes.update({p + "mlp.gate_proj.weight": (c.intermediate_size, H),
                           p + "mlp.up_proj.weight": (c.intermediate_size, H),
                           p + "mlp.down_proj.weight": (H, c.intermediate_size)})
    return shapes


def to_hf_state_dict(model) -> dict[str, torch.Tensor]:
    """The model's weights under Hugging Face names (experts split per expert)."""
    out = {}
    I = model.config.moe_intermediate_size
    for name, t in model.state_dict().items():
        t = t.detach()
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        if name.endswith(".mlp.w_gate_up"):
            p = name[: -len("w_gate_up")]
            for j in range(t.shape[0]):
                out[f"{p}experts.{j}.gate_proj.weight"] = t[j, :I]
                out[f"{p}experts.{j}.up_proj.weight"] = t[j, I:]
        elif name.endswith(".mlp.w_down"):
            p = name[: -len("w_down")]
            for j in range(t.shape[0]):
                out[f"{p}experts.{j}.down_proj.weight"] = t[j]
        else:
            out[name] = t
    return out


def save_pretrained(model, path, max_shard_bytes: int | None = None) -> None:
    """Write config.json and the weights (sharded when larger than ``max_shard_bytes``)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous().cpu() for k, v in to_hf_state_dict(model).items()}
    dtype = next(iter(tensors.values())).dtype
    cfg = model.config.to_hf_dict()
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    if max_shard_bytes is None or total <= max_shard_bytes:
        save_file(tensors, str(path / SINGLE_FILE), metadata={"format": "pt"})
        return
    shards, current, size = [], {}, 0
    for k, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[k] = t
        size += nbytes
    shards.append(current)
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in shard})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def _open_weights(path: Path) -> dict[str, tuple[Path, str]]:
    """key -> (file, key) for every tensor of the checkpoint."""
    from safetensors import safe_open

    if (path / INDEX_FILE).is_file():
        weight_map = json.loads((path / INDEX_FILE).read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{path / INDEX_FILE} has no weight_map")
        files = sorted(set(weight_map.values()))
    elif (path / SINGLE_FILE).is_file():
        files, weight_map = [SINGLE_FILE], None
    else:
        raise CheckpointError(f"{path} has neither {SINGLE_FILE} nor {INDEX_FILE}")
    where = {}
    for fname in files:
        f = path / fname
        if not f.is_file():
            raise CheckpointError(f"shard {f} listed in {INDEX_FILE} does not exist")
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():
                if weight_map is not None and weight_map.get(k) != fname:
                    raise CheckpointError(f"tensor {k!r} found in {fname} but the index maps it "
                                          f"to {weight_map.get(k)!r}")
                where[k] = f
    if weight_map is not None:
        absent = sorted(set(weight_map) - set(where))
        if absent:
            raise CheckpointError(f"tensor {absent[0]!r} (and {len(absent) - 1} more) listed in "
                                  f"{INDEX_FILE} is missing from its shard")
    return where


def load_pretrained(path, dtype: torch.dtype = torch.bfloat16, device="cpu"):
    from safetensors import safe_open

    from trace_rl.model.qwen3_moe import MoEForCausalLM

    path = Path(path)
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path} has no config.json")
    config = MoEConfig.from_hf_dict(json.loads((path / "config.json").read_text()))
    with torch.device("meta"):  # no memory, no random init: every weight comes from the files
        model = MoEForCausalLM(config)
    model = model.to_empty(device=device).to(dtype)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    expected = _expected_hf_shapes(config)
    where = _open_weights(path)
    unexpected = sorted(set(where) - set(expected) - ({"lm_head.weight"} if config.tie_word_embeddings else set()))
    if unexpected:
        raise CheckpointError(f"unexpected tensor {unexpected[0]!r} in {path} "
                              f"({len(unexpected)} unexpected in all)")
    missing = sorted(set(expected) - set(where))
    if missing:
        raise CheckpointError(f"missing tensor {missing[0]!r} in {path} ({len(missing)} missing in all)")
    params = dict(model.named_parameters(remove_duplicate=False))
    handles, tied_head = {}, None
    try:
        with torch.no_grad():
            for key, f in where.items():
                h = handles.get(f) or handles.setdefault(f, safe_open(str(f), framework="pt"))
                t = h.get_tensor(key)
                want = expected.get(key, expected.get("model.embed_tokens.weight"))
                if tuple(t.shape) != want:
                    raise CheckpointError(f"tensor {key!r} has shape {tuple(t.shape)}, expected {want}")
                if not t.dtype.is_floating_point:
                    raise CheckpointError(f"tensor {key!r} has non-floating dtype {t.dtype}")
                m = _EXPERT_KEY.match(key)
                if m:
                    l, j, which = int(m[1]), int(m[2]), m[3]
                    I = config.moe_intermediate_size
                    if which == "down_proj":
                        params[f"model.layers.{l}.mlp.w_down"][j].copy_(t)
                    else:
                        rows = slice(0, I) if which == "gate_proj" else slice(I, 2 * I)
                        params[f"model.layers.{l}.mlp.w_gate_up"][j, rows].copy_(t)
                elif key == "lm_head.weight" and config.tie_word_embeddings:
                    tied_head = t  # compared once the embeddings are in
                else:
                    params[key].copy_(t)
            if tied_head is not None and not torch.equal(tied_head.to(dtype).to(device),
                                                    model.model.embed_tokens.weight):
                raise CheckpointError("tie_word_embeddings is true but 'lm_head.weight' differs "
                                      "from 'model.embed_tokens.weight'")
    finally:
        handles.clear()
    return model

