"""The split-KV plan of decode attention (attention.plan_splits): split s covers tiles [s x tiles_per_split,
(s + 1) x tiles_per_split), as split_range in attention_decode.cuh reads it."""

from __future__ import annotations

import pytest

from trace_kernels import attention

TILE = 64


@pytest.mark.parametrize("batch,tokens", [(1, 1), (1, 100), (8, 8192), (4, 131072), (32, 32768), (251, 131072)])
def test_split_plan_covers_every_tile(batch, tokens):
    plan = attention.plan_splits(batch, 4, tokens, TILE, 396)
    tiles = -(-tokens // TILE)
    assert 1 <= plan.splits <= tiles and (plan.splits - 1) * plan.tiles_per_split < tiles <= plan.splits * plan.tiles_per_split
    assert attention.plan_splits(batch, 4, tokens, TILE, 396, num_splits=3).splits == min(3, -(-tiles // -(-tiles // 3)))


@pytest.mark.parametrize("batch,tokens,want", [
    (8, 32768, (32, 16)),     # issue 5's cases at mma4l's 2 CTAs of 64-token tiles per SM on 132 SMs: one wave
    (4, 131072, (64, 32)),
    (32, 32768, (8, 64)),
    (8, 8192, (32, 4)),
])
def test_split_plan_fills_one_wave(batch, tokens, want):
    """The planned splits of the four benchmark cases: the counts the H100 / H200 A/Bs ran (splits, tiles each)."""
    assert tuple(attention.plan_splits(batch, 1, tokens, TILE, 264)) == want
