"""Trainer quantizers against the rollout's RoundToNearest + GuidanceRecorder."""
import pytest
import torch

from trace_kernels import nvfp4
from trace_rl.quant import GuidanceRecorder, RoundToNearest, TokenIndex
from trace_rl.trainer.quantizers import AuditedRoundToNearest, GuidedQuantizer, QuantStats

N, H, K_SLOTS, I, HKV, D = 12, 64, 2, 32, 2, 16


def _index(n=N, seq0=100):
    return TokenIndex(torch.arange(n, dtype=torch.int64) // 4 + seq0,
                      torch.arange(n, dtype=torch.int64) % 4)


def _site_inputs(gen):
    experts = torch.stack([torch.randperm(8, generator=gen)[:K_SLOTS] for _ in range(N)])  # [N, k]
    return {
        "moe_in": (torch.randn(N, H, generator=gen), None),
        "moe_act": (torch.randn(N, K_SLOTS, I, generator=gen) * 3, experts),
        "k": (torch.randn(N, HKV, D, generator=gen), None),
        "v": (torch.randn(N, HKV, D, generator=gen) * 0.1, None),
    }


def _record(inputs, mode, dtype=torch.bfloat16):
    rec = GuidanceRecorder(mode=mode)
    rollout = RoundToNearest(capture=rec)
    outs = {site: rollout.activation(0, site, x.to(dtype), _index(), e) for site, (x, e) in inputs.items()}
    return outs, rec.finalize()


@pytest.mark.parametrize("mode", ["compact", "full"])
def test_guided_reproduces_rollout_values_exactly(mode):
    gen = torch.Generator().manual_seed(0)
    inputs = _site_inputs(gen)
    rollout_out, batch = _record(inputs, mode)
    stats = QuantStats()
    trainer = GuidedQuantizer(batch, stats)
    for site, (x, e) in inputs.items():
        y = trainer.activation(0, site, x.to(torch.bfloat16), _index(), e)
        assert torch.equal(y, rollout_out[site]), site
    summary = stats.summary()
    assert summary["guidance_fallback_elements"] == 0
    if mode == "full":
        assert summary["code_agreement"]["all"] == 1.0
    w = torch.randn(4, 32, 64, generator=gen).bfloat16()
    assert torch.equal(trainer.weight(0, "gate_up", w), RoundToNearest().weight(0, "gate_up", w))


def test_perturbed_trainer_values_trace_vs_qat_agreement():
    gen = torch.Generator().manual_seed(1)
    inputs = _site_inputs(gen)
    _, batch = _record(inputs, "full", dtype=torch.float32)
    trace_stats, qat_stats = QuantStats(), QuantStats()
    guided, qat = GuidedQuantizer(batch, trace_stats), AuditedRoundToNearest(batch, qat_stats)
    for site, (x, e) in inputs.items():
        noisy = x * (1 + 0.02 * torch.randn(x.shape, generator=gen))  # trainer's slightly different values
        guided.activation(0, site, noisy, _index(), e)
        qat.activation(0, site, noisy, _index(), e)
    t, q = trace_stats.summary(), qat_stats.summary()
    for site in ("moe_in", "moe_act", "k", "v", "all"):
        assert t["code_agreement_neighbour"][site] == 1.0, site
        assert q["code_agreement_neighbour"][site] < 1.0, site
    assert t["code_agreement"]["all"] > q["code_agreement"]["all"]
    hist = q["code_distance_histogram"]["all"]
    assert sum(hist.values()) == qat_stats.sites["moe_in"].audited + sum(
        qat_stats.sites[s].audited for s in ("moe_act", "k", "v"))
    assert hist.get("1", 0) + hist.get("-1", 0) > 0  # QAT's mismatches are mostly one step away


def test_moe_act_slots_are_matched_by_expert_and_misses_fall_back():
    gen = torch.Generator().manual_seed(2)
    inputs = _site_inputs(gen)
    rollout_out, batch = _record(inputs, "compact")
    x, experts = inputs["moe_act"]
    x = x.bfloat16()
    stats = QuantStats()
    trainer = GuidedQuantizer(batch, stats)
    # Same experts in swapped slot order: each slot must use the guidance of its own expert.
    swapped = trainer.activation(0, "moe_act", x.flip(1), _index(), experts.flip(1))
    assert torch.equal(swapped, rollout_out["moe_act"].flip(1))
    # A token routed to an expert the rollout did not use: that slot falls back to round-to-nearest.
    changed = experts.clone()
    changed[0, 0] = 8  # expert 8 does not exist in the rollout (8 experts: 0..7)
    y = trainer.activation(0, "moe_act", x, _index(), changed)
    assert torch.equal(y[0, 0], nvfp4.fake_quantize(x[0, 0]))
    assert torch.equal(y[1:], rollout_out["moe_act"][1:])
    # An unknown token (different sequence id) falls back entirely.
    y = trainer.activation(0, "moe_in", inputs["moe_in"][0].bfloat16(), _index(seq0=999))
    assert torch.equal(y, nvfp4.fake_quantize(inputs["moe_in"][0].bfloat16()))
    s = stats.summary()
    assert s["guidance_fallback_elements"] == I + N * H
    assert stats.sites["moe_act"].fallback_elements == I


def test_straight_through_gradient():
    gen = torch.Generator().manual_seed(3)
    inputs = _site_inputs(gen)
    _, batch = _record(inputs, "compact", dtype=torch.float32)
    x = inputs["moe_in"][0].clone().requires_grad_(True)
    GuidedQuantizer(batch).activation(0, "moe_in", x, _index()).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


@pytest.mark.gpu
def test_guided_kernel_path_matches_the_reference_on_gpu():
    """On CUDA, trace mode rounds with the toolchain kernel: bit-exact with the nvfp4 reference."""
    gen = torch.Generator().manual_seed(4)
    inputs = _site_inputs(gen)
    _, batch = _record(inputs, "compact")
    batch = batch.to("cuda")
    kernel, reference = GuidedQuantizer(batch, kernel=True), GuidedQuantizer(batch, kernel=False)
    for site, (x, e) in inputs.items():
        x = (x * (1 + 0.01 * torch.randn(x.shape, generator=gen))).bfloat16().cuda()
        e = None if e is None else e.cuda()
        index = TokenIndex(_index().seq_ids.cuda(), _index().positions.cuda())
        assert torch.equal(kernel.activation(0, site, x, index, e),
                           reference.activation(0, site, x, index, e)), site
