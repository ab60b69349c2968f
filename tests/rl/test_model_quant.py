"""The Quantizer hook: what RoundToNearest records is exactly what a trainer needs to reproduce it."""
import pytest
import torch

from trace_kernels import nvfp4
from trace_rl.config import load_preset
from trace_rl.model import MoEForCausalLM
from trace_rl.quant import GuidanceRecorder, RoundToNearest, TokenIndex



class Tap(RoundToNearest):
    """RoundToNearest that also keeps every input and output per (layer, site)."""

    def __init__(self, capture):
        super().__init__(capture=capture)
        self.seen = []

    def activation(self, layer, site, x, index, experts=None):
        y = super().activation(layer, site, x, index, experts)
        self.seen.append((layer, site, x.detach().clone(), y.detach().clone(), index, experts))
        return y


@pytest.mark.parametrize("mode", ["compact", "full"])
def test_recorded_guidance_reproduces_rollout_values(mode):
    model = MoEForCausalLM(load_preset("tiny")).init_weights(seed=5)
    ids = torch.randint(0, 96, (3, 7))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[2, 4:] = 0
    tap = Tap(GuidanceRecorder(mode))
    model(ids, quant=tap, seq_ids=torch.tensor([10, 11, 12]), attention_mask=mask)
    batch = tap.capture.finalize()
    sites = {(l, s) for l, s, *_ in tap.seen}
    assert sites == set(batch.tables) and len(sites) == 2 * 4
    for layer, site, x, y, index, experts in tap.seen:
        g, found = batch.lookup(layer, site, index.seq_ids, index.positions)
        assert found.all() and len(index) == 3 * 7 - 3
        assert torch.equal(nvfp4.guided_fake_quantize(x, g), y)
        if site == "moe_act":
            e, found_e = batch.experts(layer, index.seq_ids, index.positions)
            assert found_e.all() and torch.equal(e, experts)
        # a trainer's slightly different values land on the rollout's codes
        x2 = x * (1 + 1e-3 * torch.randn_like(x))
        agree = nvfp4.agreement(nvfp4.quantize(y).codes,
                                nvfp4.quantize(nvfp4.guided_fake_quantize(x2, g)).codes)
        assert agree["equal_fraction"] > 0.99


def test_hook_validates_shapes():
    q = RoundToNearest()
    idx = TokenIndex(torch.arange(3), torch.arange(3))
    with pytest.raises(ValueError, match="unknown quantization site"):
        q.activation(0, "q", torch.randn(3, 16), idx)
    with pytest.raises(ValueError, match="rows"):
        q.activation(0, "moe_in", torch.randn(4, 16), idx)
    with pytest.raises(ValueError, match="experts"):
        q.activation(0, "moe_act", torch.randn(3, 2, 16), idx)
    with pytest.raises(ValueError, match="unknown expert weight"):
        q.weight(0, "up", torch.randn(2, 16, 16))
    with pytest.raises(ValueError, match="1-D"):
        TokenIndex(torch.arange(3), torch.arange(4))
    with pytest.raises(ValueError, match="guidance mode"):
        GuidanceRecorder("tiny")


def test_straight_through_is_exact_in_bf16():
    x = (torch.randn(5, 2, 32) * 3).to(torch.bfloat16).requires_grad_()
    idx = TokenIndex(torch.zeros(5, dtype=torch.long), torch.arange(5))
    y = RoundToNearest().activation(0, "k", x, idx)
    assert torch.equal(y, nvfp4.fake_quantize(x.detach()))
    y.float().sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
