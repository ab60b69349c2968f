"""MoEForCausalLM against an independent, straightforward implementation (per-head attention
with explicit masks, per-expert loop over routed tokens), plus config validation."""
import math

import pytest
import torch

from trace_kernels import nvfp4
from trace_rl.config import ConfigError, MoEConfig, load_preset
from trace_rl.model import AttentionMask, MoEForCausalLM, grouped_linear, masked_attention, sort_by_expert
from trace_rl.quant import RoundToNearest, fake_quantize_experts



def small_config(**kw):
    base = dict(vocab_size=40, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, moe_intermediate_size=16, num_experts=6,
                num_experts_per_tok=2, intermediate_size=48, mlp_only_layers=[1],
                norm_topk_prob=False, tie_word_embeddings=False, rope_theta=10000.0)
    base.update(kw)
    return MoEConfig(**base)


def reference_forward(model, ids, forced=None):
    """Straightforward float64 forward of one unpadded sequence ids [T] -> logits [T, V]."""
    c = model.config
    sd = {k: v.double() for k, v in model.state_dict().items()}
    T, D = ids.shape[0], c.head_dim

    def norm(x, w):
        return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + c.rms_norm_eps)

    def rope(x):  # x [T, heads, D]; rotate pairs (i, i + D/2)
        out = torch.empty_like(x)
        for i in range(D // 2):
            ang = torch.arange(T, dtype=torch.float64) * c.rope_theta ** (-2 * i / D)
            cos, sin = torch.cos(ang)[:, None], torch.sin(ang)[:, None]
            a, b = x[..., i], x[..., i + D // 2]
            out[..., i] = a * cos - b * sin
            out[..., i + D // 2] = b * cos + a * sin
        return out

    h = sd["model.embed_tokens.weight"][ids]
    m = 0
    for l in range(c.num_hidden_layers):
        p = f"model.layers.{l}."
        x = norm(h, sd[p + "input_layernorm.weight"])
        q = (x @ sd[p + "self_attn.q_proj.weight"].T).view(T, -1, D)
        k = (x @ sd[p + "self_attn.k_proj.weight"].T).view(T, -1, D)
        v = (x @ sd[p + "self_attn.v_proj.weight"].T).view(T, -1, D)
        q, k = rope(norm(q, sd[p + "self_attn.q_norm.weight"])), rope(norm(k, sd[p + "self_attn.k_norm.weight"]))
        group = c.num_attention_heads // c.num_key_value_heads
        heads = []
        for hq in range(c.num_attention_heads):
            s = q[:, hq] @ k[:, hq // group].T / math.sqrt(D)
            s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            heads.append(torch.softmax(s, -1) @ v[:, hq // group])
        h = h + torch.cat(heads, -1) @ sd[p + "self_attn.o_proj.weight"].T
        x = norm(h, sd[p + "post_attention_layernorm.weight"])
        if c.is_moe_layer(l):
            probs = torch.softmax(x @ sd[p + "mlp.gate.weight"].T, -1)
            w, e = torch.topk(probs, c.num_experts_per_tok, -1)
            if forced is not None:
                e = forced[m]
                w = probs.gather(1, e)
            if c.norm_topk_prob:
                w = w / w.sum(-1, keepdim=True)
            y = torch.zeros_like(x)
            I = c.moe_intermediate_size
            for j in range(c.num_experts):
                tok, slot = torch.nonzero(e == j, as_tuple=True)
                if tok.numel() == 0:
                    continue
                gu = sd[p + "mlp.w_gate_up"][j]
                a = torch.nn.functional.silu(x[tok] @ gu[:I].T) * (x[tok] @ gu[I:].T)
                y.index_add_(0, tok, w[tok, slot, None] * (a @ sd[p + "mlp.w_down"][j].T))
            m += 1
        else:
            a = torch.nn.functional.silu(x @ sd[p + "mlp.gate_proj.weight"].T) * (x @ sd[p + "mlp.up_proj.weight"].T)
            y = a @ sd[p + "mlp.down_proj.weight"].T
        h = h + y
    return norm(h, sd["model.norm.weight"]) @ sd["lm_head.weight"].T


@pytest.mark.parametrize("config", ["tiny", "custom"])
def test_forward_matches_reference(config):
    torch.manual_seed(0)
    cfg = load_preset("tiny") if config == "tiny" else small_config()
    model = MoEForCausalLM(cfg).init_weights(seed=1)
    ids = torch.randint(0, cfg.vocab_size, (2, 11))
    out = model(ids)
    for b in range(2):
        ref = reference_forward(model, ids[b])
        torch.testing.assert_close(out.logits[b].double(), ref, atol=2e-5, rtol=1e-4)


def test_forced_experts_and_padding():
    torch.manual_seed(0)
    model = MoEForCausalLM(small_config()).init_weights(seed=2)
    ids = torch.randint(0, 40, (2, 9))
    forced = [torch.randint(0, 6, (2, 9, 2)) for _ in model.moe_layers]
    for f in forced:  # distinct experts per token
        f[..., 1] = (f[..., 0] + 1 + torch.randint(0, 5, f[..., 1].shape)) % 6
    out = model(ids, forced_experts=forced)
    assert all(torch.equal(r, f) for r, f in zip(out.router_topk, forced))
    ref = reference_forward(model, ids[0], forced=[f[0] for f in forced])
    torch.testing.assert_close(out.logits[0].double(), ref, atol=2e-5, rtol=1e-4)
    # right padding: the real prefix of row 1 computes as if alone
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 5:] = 0
    padded = model(ids, attention_mask=mask)
    alone = model(ids[1:, :5])
    torch.testing.assert_close(padded.logits[1, :5], alone.logits[0], atol=1e-5, rtol=1e-5)
    assert (padded.logits[1, 5:] == 0).all() and (padded.router_topk[0][1, 5:] == -1).all()
    # -1 rows fall back to the router's own choice
    plain = model(ids)
    replay = [r.clone() for r in plain.router_topk]
    for r in replay:
        r[:, -1] = -1
    torch.testing.assert_close(model(ids, forced_experts=replay).logits, plain.logits)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_masked_attention_is_sdpa_with_the_boolean_mask(dtype):
    """The additive mask built once per dtype gives bitwise what SDPA computes from the boolean mask."""
    g = torch.Generator().manual_seed(7)
    B, Hq, Hkv, Tq, S, D = 3, 4, 2, 5, 9, 16
    q = torch.randn(B, Hq, Tq, D, generator=g).to(dtype)
    k, v = (torch.randn(B, Hkv, S, D, generator=g).to(dtype) for _ in range(2))
    allowed = torch.rand(B, Tq, S, generator=g) < 0.6
    allowed[:, :, 0] = True  # every query sees a key
    allowed[1, 2] = False
    allowed[1, 2, 3] = True  # a row with a single key
    mask = AttentionMask(allowed)
    out = masked_attention(q, k, v, mask)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None], enable_gqa=True)
    assert torch.equal(out, want)
    assert mask.additive(dtype) is mask.additive(dtype)  # built once for every layer
    assert mask.additive(dtype).dtype == dtype and torch.equal(mask.additive(dtype) == 0, allowed)


def test_grouped_linear_and_dispatch():
    torch.manual_seed(0)
    experts = torch.randint(0, 5, (7, 3))
    order, row_index, offsets = sort_by_expert(experts, 5)
    assert offsets[0] == 0 and offsets[-1] == 21 and offsets.dtype == torch.int32
    assert torch.equal(experts.reshape(-1)[order], experts.reshape(-1).sort(stable=True).values)
    a, w = torch.randn(7, 32), torch.randn(5, 8, 32)
    out = grouped_linear(a, w, offsets, row_index)
    for r in range(21):
        e = int(experts.reshape(-1)[order[r]])
        torch.testing.assert_close(out[r], w[e] @ a[row_index[r]])


def test_fake_quantize_experts_is_per_expert_tensor_scale():
    w = torch.randn(4, 16, 48) * torch.tensor([1e-3, 1.0, 30.0, 0.2])[:, None, None]
    want = torch.stack([nvfp4.fake_quantize(w[e], scale="tensor") for e in range(4)])
    assert torch.equal(fake_quantize_experts(w), want)


def test_quantized_forward_backward():
    """RoundToNearest at every site: finite logits, gradients reach all expert weights (STE)."""
    model = MoEForCausalLM(load_preset("tiny")).init_weights(seed=3)
    ids = torch.randint(0, 96, (2, 8))
    out = model(ids, quant=RoundToNearest())
    out.logits.logsumexp(-1).mean().backward()
    for name, p in model.expert_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("bad, match", [
    (dict(head_dim=12), "head_dim"),
    (dict(num_key_value_heads=3), "multiple"),
    (dict(num_experts_per_tok=9), "num_experts_per_tok"),
    (dict(mlp_only_layers=[7]), "mlp_only_layers"),
    (dict(moe_intermediate_size=20), "moe_intermediate_size"),
    (dict(vocab_size=0), "vocab_size"),
])
def test_bad_config_raises(bad, match):
    with pytest.raises(ConfigError, match=match):
        small_config(**bad)


@pytest.mark.parametrize("field, value, match", [
    ("rope_scaling", {"type": "yarn", "factor": 4.0}, "rope_scaling"),
    ("hidden_act", "gelu", "hidden_act"),
    ("use_sliding_window", True, "use_sliding_window"),
    ("attention_bias", True, "attention_bias"),
    ("frobnicate", 1, "frobnicate"),
    ("model_type", "llama", "model_type"),
])
def test_bad_hf_config_raises(field, value, match):
    d = small_config().to_hf_dict()
    d[field] = value
    with pytest.raises(ConfigError, match=match):
        MoEConfig.from_hf_dict(d)


def test_hf_config_round_trip_and_presets():
    cfg = small_config()
    assert MoEConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    d = cfg.to_hf_dict()
    del d["num_experts"]
    with pytest.raises(ConfigError, match="num_experts"):
        MoEConfig.from_hf_dict(d)
    bench = load_preset("bench")
    assert (bench.num_experts, bench.hidden_size, bench.moe_intermediate_size,
            bench.num_experts_per_tok, bench.head_dim) == (128, 2048, 768, 8, 128)
    assert load_preset("small").moe_layers() == [1, 2, 3, 4, 5]
    with pytest.raises(ConfigError, match="unknown model preset"):
        load_preset("huge")
