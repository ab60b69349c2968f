"""One generated sequence: its tokens, log-probs, KV block table and status."""
from __future__ import annotations

from enum import Enum


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    __slots__ = ("seq_id", "prompt_index", "sample_index", "rng_key", "token_ids", "num_prompt",
                 "logprobs", "block_table", "block_table_tensor", "num_cached", "max_tokens", "status", "finish_reason")

    def __init__(self, seq_id: int, prompt_index: int, sample_index: int, rng_key: int,
                 prompt_ids: list[int], max_tokens: int):
        self.seq_id = seq_id  # engine-assigned, unique over the engine's life; keys guidance
        self.prompt_index, self.sample_index = prompt_index, sample_index
        self.rng_key = rng_key  # seeds this sequence's own random stream (see sampler)
        self.token_ids = list(prompt_ids)
        self.num_prompt = len(prompt_ids)
        self.logprobs: list[float] = []
        self.block_table: list[int] = []
        self.block_table_tensor = None  # int64 [len(block_table)] host copy, made once (ModelRunner)
        self.num_cached = 0  # tokens whose K/V are in the cache
        self.max_tokens = max_tokens  # prompt + the most output tokens it may get
        self.status = Status.WAITING
        self.finish_reason: str | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt:]

    def append(self, token: int, logprob: float) -> None:
        self.token_ids.append(token)
        self.logprobs.append(logprob)

    def finish(self, reason: str) -> None:
        self.status = Status.FINISHED
        self.finish_reason = reason
