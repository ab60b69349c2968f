"""GRPO losses against values computed by hand."""
import math

import pytest
import torch

from trace_rl import grpo


def test_grpo_advantages_hand_values():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0])
    adv = grpo.get_advantage("grpo")(rewards, 2)
    # group (1, 0): mean 0.5, std 0.5 -> (+1, -1); (0, 1) -> (-1, +1); (2, 2): std 0 -> 0.
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, -1.0, 1.0, 0.0, 0.0]), atol=1e-5)
    adv3 = grpo.get_advantage("grpo")(torch.tensor([0.0, 0.0, 3.0]), 3)
    std = math.sqrt(2.0)  # population std of (0, 0, 3)
    assert torch.allclose(adv3, torch.tensor([-1.0, -1.0, 2.0]) / (std + 1e-6), atol=1e-6)
    assert torch.allclose(grpo.get_advantage("dr_grpo")(rewards, 2),
                          torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0]))


def test_bad_group_size_and_unknown_names():
    with pytest.raises(ValueError, match="group_size"):
        grpo.grpo_advantages(torch.zeros(5), 2)
    with pytest.raises(KeyError, match="unknown policy loss"):
        grpo.get_policy_loss("ppo_but_wrong")
    with pytest.raises(ValueError, match="registered twice"):
        grpo.register_policy_loss("grpo_token_mean")(lambda: None)


def test_token_mean_weighs_tokens_not_sequences():
    values = torch.tensor([[1.0, 1.0, 1.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert grpo.token_mean(values, mask).item() == pytest.approx(7.0 / 4.0)
    assert grpo.sequence_mean(values, mask).item() == pytest.approx((1.0 + 4.0) / 2.0)


def _lp(ratios):
    return torch.log(torch.tensor(ratios, dtype=torch.float32))


def test_clipped_loss_hand_values_and_gradient():
    # One sequence, A = +1, token ratios 1.0, 1.5 (clipped at 1.28), 0.5 (not clipped for A > 0).
    # Second sequence, A = -1, ratios 0.5 (clipped at 0.8), 1.5 (unclipped), one padding token.
    old = torch.zeros(2, 3)
    logprobs = torch.stack([_lp([1.0, 1.5, 0.5]), _lp([0.5, 1.5, 1.0])]).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    loss, stats = grpo.get_policy_loss("grpo_token_mean")(logprobs, old, adv, mask)
    per_token = [-1.0, -1.28, -0.5, 0.8, 1.5]
    assert loss.item() == pytest.approx(sum(per_token) / 5, rel=1e-6)
    assert stats["clip_frac"] == pytest.approx(2 / 5)
    loss.backward()
    # d/dlp of -ratio*A = -ratio*A / 5 where unclipped, 0 where clipped, 0 on padding.
    expected = torch.tensor([[-1.0, 0.0, -0.5], [0.0, 1.5, 0.0]]) / 5
    assert torch.allclose(logprobs.grad, expected, atol=1e-6)


def test_truncated_importance_sampling_weights():
    old = torch.zeros(1, 3)
    logprobs = torch.zeros(1, 3, requires_grad=True)
    rollout = torch.log(torch.tensor([[0.25, 1.0, 4.0]]))  # weights 4 -> capped 2, 1, 0.25
    loss, stats = grpo.grpo_token_mean_loss(logprobs, old, torch.tensor([1.0]), torch.ones(1, 3),
                                            rollout_logprobs=rollout, tis_cap=2.0)
    assert loss.item() == pytest.approx(-(2.0 + 1.0 + 0.25) / 3, rel=1e-6)
    assert stats["tis_capped_frac"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="rollout_logprobs"):
        grpo.grpo_token_mean_loss(logprobs, old, torch.tensor([1.0]), torch.ones(1, 3), tis_cap=2.0)


def test_k3_kl_and_reference_penalty():
    logp = torch.log(torch.tensor([[0.5, 0.25]]))
    logq = torch.log(torch.tensor([[0.25, 0.25]]))
    mask = torch.ones(1, 2)
    # r = q/p = 0.5 and 1: k3 = (0.5 - 1 - ln 0.5) and 0.
    expected = (0.5 - 1 - math.log(0.5)) / 2
    assert grpo.k3_kl(logp, logq, mask).item() == pytest.approx(expected, rel=1e-6)
    assert grpo.max_abs_prob_diff(logp, logq, mask).item() == pytest.approx(0.25)
    old = logp.clone()
    loss, stats = grpo.grpo_token_mean_loss(logp, old, torch.zeros(1), mask,
                                            ref_logprobs=logq, kl_coef=0.1)
    assert loss.item() == pytest.approx(0.1 * expected, rel=1e-6)
    assert stats["ref_kl"] == pytest.approx(expected, rel=1e-6)


def test_sequence_mean_loss_registered_and_differs():
    logprobs = torch.zeros(2, 2)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, 3.0])
    tok, _ = grpo.get_policy_loss("grpo_token_mean")(logprobs, logprobs, adv, mask)
    seq, _ = grpo.get_policy_loss("grpo_seq_mean")(logprobs, logprobs, adv, mask)
    assert tok.item() == pytest.approx(-(1 + 1 + 3) / 3)
    assert seq.item() == pytest.approx(-(1 + 3) / 2)
