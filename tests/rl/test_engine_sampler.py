"""Sampler: Gumbel-max with counter-based randomness draws from the sampling distribution."""
import pytest
import torch

from trace_rl.engine import SamplingParams
from trace_rl.engine.sampler import sample, sampling_logprobs, uniforms


def test_uniforms_are_uniform_and_keyed():
    u = uniforms(5, torch.arange(64), torch.zeros(64, dtype=torch.long), 4096)  # [64, 4096]
    assert u.min() > 0 and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.01 and abs(u.std().item() - 12 ** -0.5) < 0.01
    hist = torch.histc(u, bins=10, min=0, max=1) / u.numel()
    assert (hist - 0.1).abs().max() < 0.01
    same = uniforms(5, torch.arange(64), torch.zeros(64, dtype=torch.long), 4096)
    assert torch.equal(u, same)
    assert not torch.equal(u, uniforms(6, torch.arange(64), torch.zeros(64, dtype=torch.long), 4096))
    assert (u[0] != u[1]).float().mean() > 0.99  # each sequence has its own stream
    moved = uniforms(5, torch.arange(64), torch.ones(64, dtype=torch.long), 4096)
    assert (moved != u).float().mean() > 0.99


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.8),
                                    SamplingParams(temperature=1.0, top_k=3),
                                    SamplingParams(temperature=1.0, top_p=0.75)])
def test_draws_follow_the_sampling_distribution(params):
    logits = torch.tensor([[0.3, 1.0, 2.0, -1.0, 0.5, 1.5]]).repeat(40000, 1)
    tokens, logprobs = sample(logits, params, seed=11, seq_keys=torch.arange(40000),
                              positions=torch.zeros(40000, dtype=torch.long))
    want = sampling_logprobs(logits[:1], params).exp()[0]  # [V]
    freq = torch.bincount(tokens, minlength=6).float() / 40000
    assert (freq - want).abs().max() < 0.012
    assert (freq[want == 0] == 0).all()  # never outside top-k / top-p
    assert torch.allclose(logprobs, want.log()[tokens])


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    keep = sampling_logprobs(logits, SamplingParams(top_p=0.8)).isfinite()[0]
    assert keep.tolist() == [True, True, False, False]
    keep = sampling_logprobs(logits, SamplingParams(top_p=0.81)).isfinite()[0]
    assert keep.tolist() == [True, True, True, False]
