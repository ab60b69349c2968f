"""Hugging Face qwen3_moe checkpoint I/O: exact round trips and clear errors."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from trace_rl.checkpoint import CheckpointError
from trace_rl.config import ConfigError, MoEConfig
from trace_rl.model import MoEForCausalLM



def model_for(tied: bool, dtype=torch.bfloat16):
    cfg = MoEConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, moe_intermediate_size=16, num_experts=4,
                    num_experts_per_tok=2, intermediate_size=48, mlp_only_layers=[0],
                    tie_word_embeddings=tied)
    return MoEForCausalLM(cfg).init_weights(seed=0).to(dtype)


def assert_same(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("shard", [None, 20_000])
def test_round_trip_exact(tmp_path, tied, shard):
    model = model_for(tied)
    model.save_pretrained(tmp_path, max_shard_bytes=shard)
    files = {p.name for p in tmp_path.iterdir()}
    assert ("model.safetensors.index.json" in files) == (shard is not None)
    loaded = MoEForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert_same(model, loaded)
    assert (loaded.lm_head.weight is loaded.model.embed_tokens.weight) == tied
    ids = torch.randint(0, 40, (1, 6))
    assert torch.equal(model(ids).logits, loaded(ids).logits)


def test_hf_key_names(tmp_path):
    model_for(False).save_pretrained(tmp_path)
    keys = set(load_file(tmp_path / "model.safetensors"))
    assert "model.layers.1.mlp.experts.3.gate_proj.weight" in keys
    assert "model.layers.1.mlp.experts.0.down_proj.weight" in keys
    assert "model.layers.0.mlp.gate_proj.weight" in keys  # dense layer
    assert "model.layers.1.mlp.gate.weight" in keys and "lm_head.weight" in keys
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_moe" and cfg["torch_dtype"] == "bfloat16"


def _edit(tmp_path, fn):
    model_for(False).save_pretrained(tmp_path)
    t = load_file(tmp_path / "model.safetensors")
    fn(t)
    save_file(t, tmp_path / "model.safetensors")


def test_missing_tensor_named(tmp_path):
    _edit(tmp_path, lambda t: t.pop("model.layers.1.mlp.experts.2.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.experts\.2\.up_proj\.weight"):
        MoEForCausalLM.from_pretrained(tmp_path)


def test_misshaped_tensor_named(tmp_path):
    _edit(tmp_path, lambda t: t.__setitem__("model.layers.0.self_attn.k_norm.weight", torch.ones(8)))
    with pytest.raises(CheckpointError, match=r"k_norm\.weight.*\(8,\)"):
        MoEForCausalLM.from_pretrained(tmp_path)


def test_unexpected_tensor_named(tmp_path):
    _edit(tmp_path, lambda t: t.__setitem__("model.layers.1.mlp.experts.9.up_proj.weight", torch.ones(16, 32)))
    with pytest.raises(CheckpointError, match=r"experts\.9"):
        MoEForCausalLM.from_pretrained(tmp_path)


def test_bad_config_and_layout(tmp_path):
    model_for(False).save_pretrained(tmp_path, max_shard_bytes=20_000)
    cfg = json.loads((tmp_path / "config.json").read_text())
    shard = sorted(tmp_path.glob("model-*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(CheckpointError, match="does not exist"):
        MoEForCausalLM.from_pretrained(tmp_path)
    cfg["rope_scaling"] = {"type": "linear", "factor": 2.0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="rope_scaling"):
        MoEForCausalLM.from_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="config.json"):
        MoEForCausalLM.from_pretrained(tmp_path / "nowhere")
