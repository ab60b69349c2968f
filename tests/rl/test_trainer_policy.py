"""Policy trainer on the tiny model: trace-mode exactness, batch layout, GRPO and SFT steps."""
import pytest
import torch

from trace_rl.model import MoEForCausalLM
from trace_rl.quant import GuidanceRecorder, RoundToNearest
from trace_rl.trainer import PolicyTrainer, build_train_batch, make_quantizer, parse_config, sft_batch


def _model(dtype=torch.bfloat16, seed=0):
    return MoEForCausalLM.from_preset("tiny", seed=seed, dtype=dtype)


def _samples(gen, B=4, vocab=96):
    prompts = [torch.randint(3, vocab, (int(torch.randint(3, 7, (1,), generator=gen)),), generator=gen).tolist()
               for _ in range(B)]
    responses = [torch.randint(3, vocab, (int(torch.randint(1, 5, (1,), generator=gen)),), generator=gen).tolist()
                 for _ in range(B)]
    return prompts, responses


def test_trace_mode_reproduces_rollout_forward_exactly():
    """Given the rollout's own activations, guided rounding gives the rollout's values bit for bit."""
    model = _model()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 96, (3, 9), generator=gen)
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[1, 6:] = False
    seq_ids = torch.tensor([40, 41, 42])
    for mode in ("compact", "full"):
        rec = GuidanceRecorder(mode)
        with torch.no_grad():
            rollout = model(ids, quant=RoundToNearest(capture=rec), seq_ids=seq_ids, attention_mask=mask)
            quant = make_quantizer("trace", rec.finalize())
            trainer = model(ids, quant=quant, seq_ids=seq_ids, attention_mask=mask)
        assert torch.equal(trainer.logits, rollout.logits)
        summary = quant.stats.summary()
        assert summary["guidance_fallback_elements"] == 0
        if mode == "full":
            assert all(summary["code_agreement"][k] == 1.0 for k in ("moe_in", "moe_act", "k", "v"))
    # Without the right sequence ids, nothing is guided: every element falls back and is counted.
    quant = make_quantizer("trace", rec.finalize())
    with torch.no_grad():
        model(ids, quant=quant, seq_ids=seq_ids + 100, attention_mask=mask)
    assert quant.stats.summary()["guidance_fallback_fraction"]["all"] == 1.0


def test_batch_layout_and_logprobs_match_a_manual_forward():
    model = _model(torch.float32)
    gen = torch.Generator().manual_seed(1)
    prompts, responses = _samples(gen)
    lps = [[0.0] * len(r) for r in responses]
    batch = build_train_batch(prompts, responses, lps, [7, 8, 9, 10], [1.0, 0.0, 0.0, 1.0], pad_id=0)
    trainer = PolicyTrainer(model, parse_config({}).trainer)
    with torch.no_grad():
        lp, _ = trainer.token_logprobs(batch, temperature=0.7)
        for b, (p, r) in enumerate(zip(prompts, responses)):
            full = torch.tensor([p + r[:-1]])
            logits = model(full).logits[0, len(p) - 1:].float() / 0.7  # predicts r[0..]
            want = torch.log_softmax(logits, -1)[torch.arange(len(r)), torch.tensor(r)]
            assert torch.allclose(lp[b, :len(r)], want, atol=1e-5)
            assert batch.response_mask[b].sum() == len(r)
    with pytest.raises(ValueError, match="log-probs"):
        build_train_batch(prompts, responses, [[0.0]] * 4, [0, 1, 2, 3], [0.0] * 4, pad_id=0)


@pytest.mark.parametrize("quant_mode, replay", [("bf16", False), ("qat", True), ("trace", False)])
def test_grpo_step_updates_masters_and_syncs_the_compute_model(quant_mode, replay):
    model = _model()
    gen = torch.Generator().manual_seed(2)
    prompts, responses = _samples(gen, B=4)
    seq_ids = [0, 1, 2, 3]
    guidance = None
    if quant_mode == "trace":
        rec = GuidanceRecorder("compact")
        with torch.no_grad():
            for b, (p, r) in enumerate(zip(prompts, responses)):
                model(torch.tensor([p + r[:-1]]), quant=RoundToNearest(capture=rec), seq_ids=torch.tensor([b]))
        guidance = rec.finalize()
    with torch.no_grad():
        tmp = PolicyTrainer(model, parse_config({}).trainer)
        batch = build_train_batch(prompts, responses, [[0.0] * len(r) for r in responses], seq_ids,
                                  [1.0, 0.0, 0.5, 0.0], 0)
        batch.routing = model(batch.input_ids, attention_mask=batch.attention_mask, seq_ids=batch.seq_ids,
                              quant=make_quantizer(quant_mode, guidance)).router_topk
        rollout_lp, _ = tmp.token_logprobs(batch, make_quantizer(quant_mode, guidance))
    batch.rollout_logprobs = rollout_lp
    cfg = parse_config({"trainer": {"lr": 1e-2, "routing_replay": replay, "minibatches": 1}}).trainer
    trainer = PolicyTrainer(model, cfg)
    before = [m.clone() for m in trainer.master]
    metrics = trainer.grpo_step(batch, group_size=2, temperature=1.0, quant_mode=quant_mode,
                                guidance=guidance)
    assert metrics["k3_kl"] == pytest.approx(0.0, abs=1e-6)  # same weights, same quantization
    assert metrics["route_agreement"] == 1.0
    assert metrics["grad_norm"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.master))
    for p, m in zip(trainer.params, trainer.master):
        assert p.dtype == torch.bfloat16 and m.dtype == torch.float32
        assert torch.equal(p, m.to(torch.bfloat16))
    if quant_mode == "trace":
        assert metrics["guidance_fallback_elements"] == 0


def test_two_minibatches_and_sft_loss_decreases():
    model = _model(torch.float32)
    pairs = [([1, 5, 6, 7], [8, 9, 2]), ([1, 10, 11], [12, 2])] * 4
    cfg = parse_config({"trainer": {"lr": 3e-3}}).trainer
    trainer = PolicyTrainer(model, cfg)
    batch = sft_batch(pairs, pad_id=0)
    losses = [trainer.sft_step(batch) for _ in range(15)]
    assert losses[-1] < 0.5 * losses[0]
    cfg2 = parse_config({"rollout": {"prompts_per_step": 4}, "trainer": {"minibatches": 2}}).trainer
    batch.rewards = torch.tensor([1.0, 0.0] * 4)
    m = PolicyTrainer(model, cfg2).grpo_step(batch, 2, 1.0, "bf16")
    assert m["code_agreement"]["all"] is None and m["loss"] == m["loss"]


def test_kl_to_reference_is_zero_at_the_reference_and_grows():
    import copy

    model = _model(torch.float32)
    ref = copy.deepcopy(model).requires_grad_(False)
    pairs = [([1, 5, 6, 7], [8, 9, 2]), ([1, 10, 11], [12, 2])] * 2
    batch = sft_batch(pairs, pad_id=0)
    batch.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    cfg = parse_config({"trainer": {"lr": 1e-2, "kl_coef": 0.1, "tis_cap": 0.0}}).trainer
    trainer = PolicyTrainer(model, cfg)
    first = trainer.grpo_step(batch, 2, 1.0, "bf16", ref_model=ref)
    assert first["ref_kl"] == pytest.approx(0.0, abs=1e-7) and "tis_weight_mean" not in first
    later = [trainer.grpo_step(batch, 2, 1.0, "bf16", ref_model=ref)["ref_kl"] for _ in range(3)]
    assert later[-1] > 1e-6


def test_trace_expert_weights_are_the_engines_refit_bits():
    from trace_rl.engine import RolloutEngine
    from trace_rl.guidance_store import GuidanceBatch

    model = _model()
    trainer = PolicyTrainer(model, parse_config({"trainer": {"lr": 1e-2}}).trainer)
    engine = RolloutEngine(model, mode="nvfp4", capture="compact", device="cpu")
    quant = make_quantizer("trace", guidance=GuidanceBatch("compact", {}))
    with torch.no_grad():  # a trainer update, then refit: both sides must hold the same FP4 weights
        for m in trainer.master:
            m.add_(0.01 * torch.randn_like(m))
        trainer.sync_model_from_master()
    engine.refit(trainer.model)
    theirs = dict(engine.model.expert_parameters())
    for name, w in trainer.model.expert_parameters():
        layer = int(name.split(".")[2])
        mine = quant.weight(layer, "gate_up" if name.endswith("w_gate_up") else "down", w)
        assert torch.equal(mine, theirs[name]), name
