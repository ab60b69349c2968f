"""KV page allocation. Page 0 is a scratch page never handed out: padded rows of a captured
decode graph write there, and padded block-table entries point there (always masked)."""
from __future__ import annotations

from collections import deque

from trace_rl.engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 2:
            raise ValueError(f"need at least 2 KV pages (one is scratch), got {num_blocks}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.free = deque(range(1, num_blocks))

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, seq: Sequence) -> bool:
        return len(self.free) >= self.blocks_for(seq.max_tokens)

    def allocate(self, seq: Sequence) -> None:
        """Reserve pages for the sequence's whole budget (prompt + max new tokens) up front, so a
        running sequence never waits for memory and is never preempted."""
        if seq.block_table:
            raise RuntimeError(f"sequence {seq.seq_id} already holds KV pages")
        n = self.blocks_for(seq.max_tokens)
        if n > len(self.free):
            raise RuntimeError(f"out of KV pages: sequence {seq.seq_id} needs {n}, {len(self.free)} free")
        seq.block_table = [self.free.popleft() for _ in range(n)]

    def release(self, seq: Sequence) -> None:
        self.free.extend(seq.block_table)
        seq.block_table = []
        seq.block_table_tensor = None

    def slot(self, seq: Sequence, position: int) -> int:
        """Flat cache slot (page * P + offset) of a token position."""
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size
