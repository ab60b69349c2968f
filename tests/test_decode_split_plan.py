"""The split-KV plan of decode attention (attention.plan_splits) and the kernels' reading of it (decode_cta and
split_tiles in attention_decode.cuh, compiled here for the host)."""

from __future__ import annotations

import subprocess

import pytest

from trace_kernels import attention
from trace_kernels.testing.host_program import compile_host_program

H200_SMS = 132
TILE = 64


@pytest.mark.parametrize("batch,tokens", [(1, 1), (1, 100), (8, 8192), (4, 131072), (32, 32768), (251, 131072)])
def test_split_plan_covers_every_tile(batch, tokens):
    plan = attention.plan_splits(batch, 4, tokens, TILE, 396)
    tiles = -(-tokens // TILE)
    assert not plan.uneven and plan.short_tiles == plan.tiles_per_split
    assert 1 <= plan.splits <= tiles and (plan.splits - 1) * plan.tiles_per_split < tiles <= plan.splits * plan.tiles_per_split
    assert attention.plan_splits(batch, 4, tokens, TILE, 396, num_splits=3).splits == min(3, -(-tiles // -(-tiles // 3)))


def _covered(plan: attention.SplitPlan) -> list[tuple[int, int]]:
    """[first, end) tiles of every split, as split_tiles computes them."""
    out = []
    for s in range(plan.splits):
        if s < plan.long_splits:
            first, count = s * plan.tiles_per_split, plan.tiles_per_split
        else:
            first = plan.long_splits * plan.tiles_per_split + (s - plan.long_splits) * plan.short_tiles
            count = plan.short_tiles
        out.append((first, first + count))
    return out


# (B, max tokens) of issue 5's benchmark (mma4l: one CTA per split, 2 per SM on the H200) and a few odd ones
UNEVEN_CASES = [(8, 32768), (4, 131072), (32, 32768), (2, 131072), (3, 100000), (66, 8192)]


@pytest.mark.parametrize("batch,tokens", UNEVEN_CASES)
def test_first_cta_plan_gives_the_first_placed_ctas_the_long_splits(batch, tokens):
    even = attention.plan_splits(batch, 1, tokens, TILE, 2 * H200_SMS, None, H200_SMS, 1.0)
    plan = attention.plan_splits(batch, 1, tokens, TILE, 2 * H200_SMS, None, H200_SMS, 1.2)
    tiles = -(-tokens // TILE)
    assert not even.uneven and plan.splits == even.splits
    assert plan.uneven and plan.tiles_per_split > plan.short_tiles >= 1
    assert plan.long_splits == H200_SMS // batch  # every CTA of a long split is among the first H200_SMS
    spans = _covered(plan)
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # contiguous, no overlap
    assert spans[-1][1] >= tiles and spans[-1][0] < tiles  # every tile, and the last split not empty
    # the modelled time beats the even plan's, and no shorter split would lower it further
    assert max(plan.tiles_per_split / 1.2, plan.short_tiles) < even.tiles_per_split


@pytest.mark.parametrize("batch,tokens,ctas_per_split,resident,sms,why", [
    (8, 8192, 1, 264, 132, "too few tiles per split to move one"),
    (64, 131072, 1, 264, 132, "two waves"),
    (2, 8192, 1, 264, 132, "fewer CTAs than SMs"),
    (8, 32768, 1, 396, 132, "three CTAs per SM"),
    (8, 32768, 1, 264, 0, "SM count unknown"),
    (200, 32768, 1, 264, 132, "more sequences than SMs"),
])
def test_first_cta_plan_stays_even_outside_one_wave_of_pairs(batch, tokens, ctas_per_split, resident, sms, why):
    plan = attention.plan_splits(batch, ctas_per_split, tokens, TILE, resident, None, sms, 1.2)
    assert not plan.uneven, why
    assert plan == attention.plan_splits(batch, ctas_per_split, tokens, TILE, resident)


def test_first_cta_rate_one_is_the_even_plan():
    assert attention.FIRST_CTA_RATE == 1.0  # the measured default until an A/B says otherwise
    for batch, tokens in UNEVEN_CASES:
        assert not attention.plan_splits(batch, 1, tokens, TILE, 2 * H200_SMS, None, H200_SMS, 1.0).uneven


HOST_PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include "trace_kernels/attention_decode.cuh"
// argv: tiles_per_split long_splits short_tiles splits batch -> per CTA (y, z): split b first_tile tiles
int main(int argc, char** argv) {
  trace_kernels::DecodeParams p{};
  p.tiles_per_split = atoi(argv[1]);
  p.long_splits = atoi(argv[2]);
  p.short_tiles = atoi(argv[3]);
  const int splits = atoi(argv[4]), batch = atoi(argv[5]);
  for (int z = 0; z < batch; ++z)
    for (int y = 0; y < splits; ++y) {
      const trace_kernels::DecodeCta cta = trace_kernels::decode_cta(p, y, z, splits, batch);
      const trace_kernels::SplitTiles t = trace_kernels::split_tiles(p, cta.split);
      printf("%d %d %d %d %d %d\n", y, z, cta.split, cta.b, t.first, t.count);
    }
  return 0;
}
"""


@pytest.fixture(scope="module")
def host_program(tmp_path_factory):
    return compile_host_program(HOST_PROGRAM, tmp_path_factory.mktemp("decode_cta"), "plan")


@pytest.mark.nvcc
@pytest.mark.parametrize("batch,tokens,rate", [(b, t, r) for b, t in UNEVEN_CASES for r in (1.0, 1.2)])
def test_kernel_reads_the_plan_as_planned(host_program, batch, tokens, rate):
    plan = attention.plan_splits(batch, 1, tokens, TILE, 2 * H200_SMS, None, H200_SMS, rate)
    args = [str(v) for v in (plan.tiles_per_split, plan.long_splits, plan.short_tiles, plan.splits, batch)]
    rows = [tuple(map(int, line.split())) for line in
            subprocess.run([str(host_program), *args], capture_output=True, text=True, check=True).stdout.split("\n")
            if line]
    assert len(rows) == plan.splits * batch
    assert {(split, b) for _, _, split, b, _, _ in rows} == {(s, b) for s in range(plan.splits) for b in range(batch)}
    spans = _covered(plan)
    for y, z, split, b, first, count in rows:
        assert (first, first + count) == spans[split]
        linear = y + plan.splits * z  # the hardware's placement order (x = 0: one CTA per split)
        if plan.uneven:
            assert linear == split * batch + b  # split-major
            assert (split < plan.long_splits) <= (linear < H200_SMS)  # long splits on first-placed CTAs
        else:
            assert (split, b) == (y, z)
