"""The policy in training mode: FP32 master weights under AdamW, a compute-dtype model for the
forward/backward, GRPO and SFT steps.

The compute model (BF16 by default) is what the rollout engine refits from, so in `trace` mode the
trainer's expert weights quantize to the very bits the rollout used. Gradients of the compute model
are copied to the FP32 masters, clipped, stepped, and the masters are copied back (rounded).
"""
from __future__ import annotations

import math
from contextlib import contextmanager

import torch
from torch import Tensor

from trace_rl import grpo
from trace_rl.trainer.batch import TrainBatch
from trace_rl.trainer.config import TrainerSection
from trace_rl.trainer.quantizers import AuditedRoundToNearest, GuidedQuantizer, QuantStats


def make_quantizer(mode: str, guidance=None, stats: QuantStats | None = None, audit: bool = True,
                   kernel: bool = True):
    """The trainer's Quantizer for a quantization mode: None (bf16), qat or trace.

    audit: compare the trainer's codes with the rollout's (needs full guidance; else ignored).
    kernel: trace mode on CUDA rounds with the guided fake-quant kernel (else the reference)."""
    if mode == "bf16":
        return None
    if mode == "qat":
        return AuditedRoundToNearest(guidance, stats, audit)
    if mode == "trace":
        if guidance is None:
            raise ValueError("trace mode needs the rollout's guidance")
        return GuidedQuantizer(guidance, stats, audit, kernel)
    raise ValueError(f"unknown trainer quantization mode {mode!r}; expected bf16, qat or trace")


def response_logprobs(logits: Tensor, batch: TrainBatch, temperature: float = 1.0) -> Tensor:
    """logits [B, T, V] of the teacher-forced forward -> log-probs [B, R] of the response tokens
    under softmax(logits / temperature), in FP32 (padding positions hold garbage; use the mask)."""
    cols = batch.target_cols.unsqueeze(-1).expand(-1, -1, logits.shape[-1])  # [B, R, V]
    picked = logits.gather(1, cols).float() / temperature  # [B, R, V]
    return torch.log_softmax(picked, dim=-1).gather(-1, batch.target_ids.unsqueeze(-1)).squeeze(-1)


class PolicyTrainer:
    def __init__(self, model, cfg: TrainerSection, *, lr: float | None = None):
        self.model = model  # compute dtype (bf16 or fp32), on the training device
        self.cfg = cfg
        self.names, params = zip(*model.named_parameters())  # tied weights appear once
        self.params = list(params)
        if all(p.dtype == torch.float32 for p in self.params):
            self.master = self.params  # the model is its own FP32 master
        else:
            self.master = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        self.optimizer = torch.optim.AdamW(self.master, lr=cfg.lr if lr is None else lr,
                                           betas=(cfg.beta1, cfg.beta2),
                                           weight_decay=cfg.weight_decay)
        self._moe_gates = [layer.mlp.gate for layer in model.model.layers if layer.is_moe]

    # ------------------------------------------------------------------ weights
    def master_state(self) -> dict[str, Tensor]:
        """FP32 master weights by parameter name (what checkpoints store)."""
        return dict(zip(self.names, self.master))

    @torch.no_grad()
    def sync_model_from_master(self) -> None:
        if self.master is not self.params:
            for p, m in zip(self.params, self.master):
                p.copy_(m)

    def _apply_gradients(self) -> float:
        if self.master is not self.params:
            for p, m in zip(self.params, self.master):
                m.grad = None if p.grad is None else p.grad.float()
                p.grad = None
        clip = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.master, clip))
        if math.isfinite(grad_norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.sync_model_from_master()
        return grad_norm

    # ------------------------------------------------------------------ forward
    @contextmanager
    def _capture_router(self):
        logits: list[Tensor] = []
        hooks = [g.register_forward_hook(lambda m, i, o: logits.append(o.detach()))
                 for g in self._moe_gates]
        try:
            yield logits
        finally:
            for h in hooks:
                h.remove()

    def token_logprobs(self, batch: TrainBatch, quant=None, temperature: float = 1.0,
                       replay: bool = False) -> tuple[Tensor, float | None]:
        """Log-probs [B, R] of the response tokens under logits / temperature, and the fraction
        of (token, slot) experts on which the trainer's own router agrees with the rollout's."""
        forced = None
        if replay:
            if batch.routing is None:
                raise ValueError("routing replay needs the rollout's routing in the batch")
            # pads hold -1 and are never read (masked); a real token's -1 row (none today) would
            # fall back to the trainer's router (MoEForCausalLM.forward), not a made-up expert 0
            forced = batch.routing
        with self._capture_router() as router_logits:
            out = self.model(batch.input_ids, seq_ids=batch.seq_ids, attention_mask=batch.attention_mask,
                             quant=quant, forced_experts=forced)
        return response_logprobs(out.logits, batch, temperature), self._route_agreement(batch, router_logits)

    def _route_agreement(self, batch: TrainBatch, router_logits: list[Tensor]) -> float | None:
        if batch.routing is None or not router_logits:
            return None
        b_idx, t_idx = batch.attention_mask.nonzero(as_tuple=True)  # the model's flat token order
        agree, total = 0, 0  # agree: a device tensor after the first layer, read back once
        for logits, rollout in zip(router_logits, batch.routing):
            k = rollout.shape[-1]
            mine = torch.topk(torch.softmax(logits.float(), dim=-1), k, dim=-1).indices  # [N, k]
            theirs = rollout[b_idx, t_idx]  # [N, k]
            agree = agree + (mine.unsqueeze(-1) == theirs.unsqueeze(-2)).any(-1).sum()
            total += mine.numel()
        return float(agree) / total if total else None

    # ------------------------------------------------------------------ steps
    def grpo_step(self, batch: TrainBatch, group_size: int, temperature: float, quant_mode: str,
                  guidance=None, ref_model=None) -> dict:
        """One rollout batch -> cfg.minibatches optimizer steps. Rows come in groups of group_size."""
        cfg = self.cfg
        kernel = cfg.guided_rounding == "auto"
        loss_fn = grpo.get_policy_loss(cfg.loss)
        advantages = grpo.get_advantage(cfg.advantage)(batch.rewards, group_size)  # [B]
        stats = QuantStats()
        groups = batch.size // group_size
        chunks = torch.arange(groups).tensor_split(cfg.minibatches)
        mask = batch.response_mask
        metrics: dict = {}
        fresh_old = cfg.minibatches > 1
        if fresh_old:  # the policy that generated the batch, before any of this step's updates
            with torch.no_grad():
                quant = make_quantizer(quant_mode, guidance, stats, cfg.audit, kernel)
                old_lp, route = self.token_logprobs(batch, quant, temperature, cfg.routing_replay)
        ref_lp = None
        if cfg.kl_coef > 0:  # the reference policy runs unquantized
            with torch.no_grad():
                out = ref_model(batch.input_ids, seq_ids=batch.seq_ids, attention_mask=batch.attention_mask)
                ref_lp = response_logprobs(out.logits, batch, temperature)
        all_old = torch.zeros_like(mask)
        losses, stat_sums, grad_norms = [], {}, []
        for i, chunk in enumerate(chunks):
            rows = (chunk.unsqueeze(1) * group_size + torch.arange(group_size)).reshape(-1)
            rows = rows.to(batch.input_ids.device)
            mb = batch.rows(rows)
            quant = make_quantizer(quant_mode, guidance, None if fresh_old else stats,
                                   audit=cfg.audit and not fresh_old, kernel=kernel)
            lp, mb_route = self.token_logprobs(mb, quant, temperature, cfg.routing_replay)
            if fresh_old:
                old = old_lp[rows]
            else:
                old, route = lp.detach(), mb_route
            all_old[rows] = old
            loss, st = loss_fn(lp, old, advantages[rows], mb.response_mask,
                               eps_low=cfg.eps_low, eps_high=cfg.eps_high,
                               rollout_logprobs=mb.rollout_logprobs,
                               tis_cap=cfg.tis_cap if cfg.tis_cap > 0 else None,
                               ref_logprobs=None if ref_lp is None else ref_lp[rows],
                               kl_coef=cfg.kl_coef)
            loss.backward()
            grad_norms.append(self._apply_gradients())
            losses.append(float(loss.detach()))
            for k, v in st.items():
                stat_sums[k] = stat_sums.get(k, 0.0) + v / len(chunks)
        metrics.update(stat_sums)
        metrics["loss"] = sum(losses) / len(losses)
        metrics["grad_norm"] = max(grad_norms)
        metrics["k3_kl"] = float(grpo.k3_kl(batch.rollout_logprobs, all_old, mask))
        metrics["max_abs_prob_diff"] = float(grpo.max_abs_prob_diff(batch.rollout_logprobs, all_old, mask))
        metrics["route_agreement"] = route
        metrics.update(stats.summary() if quant_mode != "bf16" else _empty_quant_summary())
        return metrics

    def sft_step(self, batch: TrainBatch) -> float:
        """Cross-entropy on the completion tokens (token mean); one optimizer step."""
        out = self.model(batch.input_ids, attention_mask=batch.attention_mask)
        nll = -response_logprobs(out.logits, batch)  # [B, R]
        loss = grpo.token_mean(nll, batch.response_mask)
        loss.backward()
        self._apply_gradients()
        return float(loss.detach())


def _empty_quant_summary() -> dict:
    kinds = ("moe_in", "moe_act", "k", "v", "all")
    empty = {k: None for k in kinds}
    return {"code_agreement": dict(empty), "code_agreement_neighbour": dict(empty),
            "neighbour_fraction": dict(empty), "guidance_fallback_fraction": dict(empty),
            "code_distance_histogram": {}, "guidance_fallback_elements": 0}
