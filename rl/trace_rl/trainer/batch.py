"""Padded training tensors from rollout samples (prompt + response), for the teacher-forced forward.

The trainer feeds prompt + response[:-1] (the last sampled token is never an input, as in the
rollout); the logits at input column P - 1 + j predict response token j.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor


@dataclass
class TrainBatch:
    input_ids: Tensor          # int64 [B, T]  prompt + response[:-1], right-padded
    attention_mask: Tensor     # bool  [B, T]
    seq_ids: Tensor            # int64 [B]     the rollout's sequence ids (guidance keys)
    target_ids: Tensor         # int64 [B, R]  response tokens, right-padded
    target_cols: Tensor        # int64 [B, R]  input column whose logits predict each target
    response_mask: Tensor      # float32 [B, R]
    rollout_logprobs: Tensor   # float32 [B, R] log-probs the rollout engine reported
    rewards: Tensor            # float32 [B]
    routing: list[Tensor] | None = None  # per MoE layer int64 [B, T, k] (rollout experts; -1 = pad)

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, idx: Tensor) -> "TrainBatch":
        """The sub-batch of rows idx (int64 [b])."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None:
                out[f.name] = None
            elif isinstance(v, list):
                out[f.name] = [t[idx] for t in v]
            else:
                out[f.name] = v[idx]
        return replace(self, **out)

    def to(self, device) -> "TrainBatch":
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = (None if v is None else [t.to(device) for t in v] if isinstance(v, list)
                           else v.to(device))
        return replace(self, **out)


def build_train_batch(prompts: list[list[int]], responses: list[list[int]],
                      rollout_logprobs: list, seq_ids: list[int], rewards: list[float],
                      pad_id: int, routing: list[list[Tensor]] | None = None) -> TrainBatch:
    """Pad B samples into a TrainBatch.

    prompts[b], responses[b]: token ids; rollout_logprobs[b]: one float per response token;
    routing[b] (optional): per MoE layer int [>= len(prompt) + len(response) - 1, k] experts the
    rollout used at each position.
    """
    B = len(prompts)
    if not (len(responses) == len(rollout_logprobs) == len(seq_ids) == len(rewards) == B):
        raise ValueError("prompts, responses, rollout_logprobs, seq_ids and rewards must have one "
                         "entry per sample")
    inputs = []
    for b in range(B):
        if len(prompts[b]) == 0:
            raise ValueError(f"sample {b} has an empty prompt")
        if len(rollout_logprobs[b]) != len(responses[b]):
            raise ValueError(f"sample {b}: {len(responses[b])} response tokens but "
                             f"{len(rollout_logprobs[b])} rollout log-probs")
        inputs.append(list(prompts[b]) + list(responses[b])[:-1])
    T = max(len(x) for x in inputs)
    R = max(1, max(len(r) for r in responses))
    input_ids = torch.full((B, T), pad_id, dtype=torch.int64)
    mask = torch.zeros(B, T, dtype=torch.bool)
    target_ids = torch.full((B, R), pad_id, dtype=torch.int64)
    target_cols = torch.zeros(B, R, dtype=torch.int64)
    response_mask = torch.zeros(B, R)
    lp = torch.zeros(B, R)
    for b in range(B):
        n, P, O = len(inputs[b]), len(prompts[b]), len(responses[b])
        input_ids[b, :n] = torch.tensor(inputs[b], dtype=torch.int64)
        mask[b, :n] = True
        if O:
            target_ids[b, :O] = torch.tensor(responses[b], dtype=torch.int64)
            target_cols[b, :O] = torch.arange(P - 1, P - 1 + O)
            response_mask[b, :O] = 1.0
            lp[b, :O] = torch.as_tensor(rollout_logprobs[b], dtype=torch.float32)
    routes = None
    if routing is not None:
        layers = len(routing[0])
        k = routing[0][0].shape[-1] if layers else 0
        routes = [torch.full((B, T, k), -1, dtype=torch.int64) for _ in range(layers)]
        for b in range(B):
            n = len(inputs[b])
            for m in range(layers):
                r = torch.as_tensor(routing[b][m]).to(torch.int64)
                if r.shape[0] < n:
                    raise ValueError(f"sample {b}: routing of MoE layer {m} covers {r.shape[0]} "
                                     f"positions, the trainer needs {n}")
                routes[m][b, :n] = r[:n]
    return TrainBatch(input_ids, mask, torch.as_tensor(seq_ids, dtype=torch.int64), target_ids,
                      target_cols, response_mask, lp, torch.as_tensor(rewards, dtype=torch.float32),
                      routes)


def sft_batch(pairs: list[tuple[list[int], list[int]]], pad_id: int) -> TrainBatch:
    """Supervised pairs (prompt ids, completion ids incl. end-of-sequence) as a TrainBatch whose
    response_mask marks the completion tokens (rollout fields are zeros)."""
    prompts = [p for p, _ in pairs]
    completions = [c for _, c in pairs]
    zeros = [[0.0] * len(c) for c in completions]
    return build_train_batch(prompts, completions, zeros, list(range(len(pairs))),
                             [0.0] * len(pairs), pad_id)
