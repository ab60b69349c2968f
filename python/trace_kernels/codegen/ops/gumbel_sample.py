"""Codegen for `gumbel_max_sample`: one kernel per logits dtype; the vocabulary size is a run-time
argument (cuda/include/trace_kernels/gumbel_sample.cuh).

A CTA holds CHUNK = CTA * ITEMS vocab ids of one row in registers; a row takes splits(V) CTAs, a
function of V alone, so a row's log-prob (whose sum order follows the splits) never depends on the
batch it was sampled in.
"""

from __future__ import annotations

import functools

from trace_kernels.codegen.registry import OpCodegen
from trace_kernels.codegen.spec import CUDA_TYPES, KernelSpec, dtype_name, kernel_name
from trace_kernels.shapes import ModelShape

NAME = "gumbel_max_sample"
TEMPLATE = "gumbel_max_sample.cu.jinja"
CTA = 512
ITEMS = 16  # vocab ids per thread: V = 151936 -> 19 CTAs per row
MIN_CTAS_PER_SM = 2  # caps ptxas at 64 registers (no spills): half occupancy for a compute-bound loop
CHUNK = CTA * ITEMS
PARTIAL_BYTES = 16  # gumbel::Partial: best, best_index, max, sum


def splits(vocab: int) -> int:
    """CTAs per row (the kernel's grid.y)."""
    return -(-vocab // CHUNK)


@functools.lru_cache(maxsize=None)  # the op builds its spec on every launch
def spec(dtype) -> KernelSpec:
    short = dtype_name(dtype)
    return KernelSpec(
        op=NAME,
        name=kernel_name(NAME, short),
        template=TEMPLATE,
        params={"cuda_type": CUDA_TYPES[short], "cta": CTA, "items": ITEMS, "min_ctas_per_sm": MIN_CTAS_PER_SM},
        launch={"threads": CTA, "chunk": CHUNK},
        headers=("trace_kernels/gumbel_sample.cuh",),
    )


def specs_for_shape(shape: ModelShape) -> list[KernelSpec]:
    return [spec("bf16")]  # the engine's logits (a BF16 model's lm_head); others build on first use


OP = OpCodegen(NAME, specs_for_shape, "logits [B, V] -> Gumbel-max token and its log-prob per row (rollout sampler)")
