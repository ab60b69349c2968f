"""Chooses each step: a prefill of newly admitted sequences, or one decode step of all running ones."""
from __future__ import annotations

from collections import deque

from trace_rl.engine.block_manager import BlockManager
from trace_rl.engine.config import EngineConfig
from trace_rl.engine.sequence import Sequence, Status


class Scheduler:
    def __init__(self, config: EngineConfig, blocks: BlockManager):
        self.config = config
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        if self.blocks.blocks_for(seq.max_tokens) > self.blocks.num_blocks - 1:
            raise ValueError(f"sequence {seq.seq_id} needs {seq.max_tokens} tokens of KV cache; the "
                             f"cache holds {(self.blocks.num_blocks - 1) * self.blocks.block_size}")
        self.waiting.append(seq)

    @property
    def done(self) -> bool:
        return not self.waiting and not self.running

    def schedule(self) -> tuple[list[Sequence], bool]:
        """(sequences, is_prefill). Prefill admits waiting sequences in order while there is room
        (sequence slots, token budget, KV pages); otherwise all running sequences decode."""
        batch, tokens = [], 0
        while self.waiting and len(self.running) + len(batch) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if batch and tokens + len(seq) > self.config.max_num_batched_tokens:
                break
            if not self.blocks.can_allocate(seq):
                break
            self.blocks.allocate(seq)
            seq.status = Status.RUNNING
            batch.append(self.waiting.popleft())
            tokens += len(seq)
        if batch:
            self.running.extend(batch)
            return batch, True
        if not self.running:
            raise RuntimeError("scheduler stalled: waiting sequences cannot get KV pages")
        return list(self.running), False

    def retire(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.release(seq)
