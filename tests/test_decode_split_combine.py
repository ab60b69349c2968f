"""The split merge inside the decode kernel (attention.FUSED_SPLIT_COMBINE): when a launch may use it, how many CTAs
merge, and the roles the kernel derives from its arrival tickets (attention_split_combine.cuh, compiled here for the
host). The merge itself runs on the GPU only (tests/gpu/test_kv_kernels.py: bit for bit the combine kernel's)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from trace_kernels import attention
from trace_kernels.testing.host_program import compile_host_program

H200_PAIRS = 2 * 132  # resident mma4l CTAs on the H200


def test_fused_merge_is_off_until_measured():
    assert attention.FUSED_SPLIT_COMBINE is False  # decided by an A/B on the GPU (docs/kv_cache.md)


@pytest.mark.parametrize("splits,batch,ctas_per_split,q_heads,resident,fused,want,why", [
    (32, 8, 1, 32, H200_PAIRS, True, 32, "mma4l at 8 x 32K: a CTA per split holds all 32 heads, one row each"),
    (8, 32, 1, 32, H200_PAIRS, True, 8, "mma4l at 32 x 32K: 8 splits, 4 rows per merging CTA"),
    (64, 4, 1, 32, H200_PAIRS, True, 32, "mma4l at 4 x 128K: the first 32 of 64 arrivals leave"),
    (12, 8, 4, 32, 396, True, 8, "a CTA per kv head: 8 rows per cell"),
    (5, 3, 2, 10, 100, True, 5, "GQA 5: 5 rows, 5 splits"),
    (32, 8, 1, 32, H200_PAIRS, False, 0, "not asked for"),
    (1, 8, 1, 32, H200_PAIRS, True, 0, "one split: nothing to merge"),
    (34, 8, 1, 32, H200_PAIRS, True, 0, "272 CTAs: not all resident at once, the waits could deadlock"),
])
def test_split_combine_ctas(splits, batch, ctas_per_split, q_heads, resident, fused, want, why):
    assert attention.split_combine_ctas(splits, batch, ctas_per_split, q_heads, resident, fused) == want, why


HOST_PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include "trace_kernels/attention_split_combine.cuh"
// argv: rows splits ctas -> per arrival ticket: ticket combiner, then per combiner: combiner rows...
int main(int argc, char** argv) {
  const int rows = atoi(argv[1]), splits = atoi(argv[2]), ctas = atoi(argv[3]);
  for (int ticket = 0; ticket < splits; ++ticket) {
    const int j = trace_kernels::split_combine::combiner_of_ticket(ticket, splits, ctas);
    printf("t %d %d\n", ticket, j);
    if (j < 0) continue;
    printf("r %d", j);
    for (int i = 0; i < trace_kernels::split_combine::rows_of_combiner(rows, ctas, j); ++i) printf(" %d", j + ctas * i);
    printf("\n");
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def roles_program(tmp_path_factory):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    return compile_host_program(HOST_PROGRAM, tmp_path_factory.mktemp("split_combine"), "roles")


@pytest.mark.nvcc
@pytest.mark.parametrize("rows,splits", [(32, 32), (32, 8), (32, 64), (8, 12), (5, 5), (12, 3), (1, 2), (64, 9)])
def test_the_last_arrivals_merge_every_row_once(roles_program, rows, splits):
    ctas = attention.split_combine_ctas(splits, 1, 1, rows, 10_000, True)
    lines = subprocess.run([str(roles_program), str(rows), str(splits), str(ctas)], capture_output=True, text=True,
                           check=True).stdout.split("\n")
    roles = [int(line.split()[2]) for line in lines if line.startswith("t ")]
    assert roles == [-1] * (splits - ctas) + list(range(ctas))  # the first arrivals leave, the last ctas merge
    merged = [int(r) for line in lines if line.startswith("r ") for r in line.split()[2:]]
    assert sorted(merged) == list(range(rows))  # every row by exactly one merging CTA
