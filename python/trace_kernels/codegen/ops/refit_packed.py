"""Codegen for `nvfp4_refit_packed`: expert weights [E, N, K] -> the MoE GEMM's packed, encoded NVFP4
(moe_layout.MoEWeights) in place, the quantize pass of ops.refit_weights_packed_
(cuda/include/trace_kernels/refit_packed.cuh; its amax pass is refit_weights' v2 kernel).

One kernel per (input dtype, row grouping, variant): groups 1 (plain rows, the down weight) or 2 (gate/up rows
interleaved by 8); every shape is a run-time argument. Per warp a ring of STAGES shared-memory
buffers of one 64 x 64 record each; 4 warps per CTA. Variants: "v1" refit_weights' v2 amax pass, then this
kernel's quantize-and-pack pass; "v2" speculative (refit_packed_speculative.cuh): one kernel launched three times,
packing with the previous sync's expert scales as a guess, then settling each expert and repacking the ones whose
scale changed (refit_weights v8's idea in the packed layout). `VARIANT` is what the op launches.
"""

from __future__ import annotations

import functools
import os

from trace_kernels.codegen.ops import refit_weights
from trace_kernels.codegen.registry import OpCodegen
from trace_kernels.codegen.spec import CUDA_TYPES, KernelSpec, dtype_name, kernel_name, resolve_variant, variant_parts
from trace_kernels.shapes import ModelShape

NAME = "nvfp4_refit_packed"
TEMPLATE = "nvfp4_refit_packed.cu.jinja"
THREADS = 128  # refit_packed::kThreads (4 warps, one record each at a time)
RECORD_ELEMS = 64 * 64  # one (64-row tile, 64-K chunk) record
AMAX_VARIANT = "v2"  # refit_weights' amax pass (phase 0 of its v2 kernel) runs first
# bf16/fp16: 2 stages x 8 KB per warp, 64 KB per CTA -> 3 CTAs (12 warps, ~96 KB of loads in flight) per SM;
# fp32: 16 KB records, 2 stages -> 1 CTA (4 warps, 64 KB in flight) per SM
STAGES = {"bf16": 2, "f16": 2, "f32": 2}
MIN_BLOCKS = {"bf16": 3, "f16": 3, "f32": 1}
VARIANTS = ("v1", "v2")
# The default: v2, speculative like refit_weights' default (docs/toolchain.md, "refit_weights_packed_ v2"): the rollout
# engine syncs each layer's experts into their own buffers, so the previous sync's scales are the usual guess.
VARIANT = os.environ.get("TRACE_KERNELS_REFIT_PACKED_VARIANT", "v2")
if VARIANT not in VARIANTS:
    raise ValueError(f"TRACE_KERNELS_REFIT_PACKED_VARIANT={VARIANT!r}; known: {', '.join(VARIANTS)}")


def smem_bytes(dtype) -> int:
    """Dynamic shared memory of the kernel for an input dtype (refit_packed::Config::kSmemBytes)."""
    short = dtype_name(dtype)
    return (THREADS // 32) * STAGES[short] * RECORD_ELEMS * (4 if short == "f32" else 2)


def check_variant(variant: str | None) -> str:
    return resolve_variant(NAME, VARIANTS, VARIANT, variant)  # VARIANT read at call time (tests patch it)


def spec(dtype, groups: int, variant: str | None = None) -> KernelSpec:
    return _spec(dtype, groups, check_variant(variant))


@functools.lru_cache(maxsize=None)
def _spec(dtype, groups: int, variant: str) -> KernelSpec:
    short = dtype_name(dtype)
    if groups not in (1, 2):
        raise ValueError(f"{NAME}: groups must be 1 or 2, got {groups}")
    speculative = variant == "v2"
    header = "trace_kernels/refit_packed_speculative.cuh" if speculative else "trace_kernels/refit_packed.cuh"
    return KernelSpec(op=NAME, name=kernel_name(NAME, *variant_parts(short, variant), dims={"g": groups}),
                      template=TEMPLATE,
                      params={"cuda_type": CUDA_TYPES[short], "groups": groups, "stages": STAGES[short],
                              "min_blocks": MIN_BLOCKS[short], "smem": smem_bytes(short), "speculative": speculative},
                      launch={"threads": THREADS, "smem": smem_bytes(short), "variant": variant},
                      headers=(header,))


def amax_spec(dtype) -> KernelSpec:
    """The amax pass: refit_weights' v2 kernel launched with phase 0."""
    return refit_weights.spec(dtype, AMAX_VARIANT)


def specs_for_shape(shape: ModelShape) -> list[KernelSpec]:
    if check_variant(None) == "v2":
        return [spec("bf16", 1), spec("bf16", 2)]  # down, gate_up (their own amax)
    return [spec("bf16", 1), spec("bf16", 2), amax_spec("bf16")]  # down, gate_up, amax pass


OP = OpCodegen(NAME, specs_for_shape,
               "expert weights [E, N, K] -> the MoE GEMM's packed, encoded NVFP4 in place (RL weight sync)")
