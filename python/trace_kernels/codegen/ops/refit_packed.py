"""Codegen for `nvfp4_refit_packed`: expert weights [E, N, K] -> the MoE GEMM's packed, encoded NVFP4
(moe_layout.MoEWeights) in place, the quantize pass of ops.refit_weights_packed_
(cuda/include/trace_kernels/refit_packed.cuh; its amax pass is refit_weights' v2 kernel).

One kernel per (input dtype, row grouping, variant): groups 1 (plain rows, the down weight) or 2 (gate/up rows
interleaved by 8); every shape is a run-time argument. Per warp a ring of STAGES shared-memory slots, each one unit
of a 64 x 64 record (the whole record, or a 64 x 32 half along K); 4 warps per CTA. Variants: "v1" refit_weights' v2
amax pass, then this kernel's quantize-and-pack pass; "v2" speculative (refit_packed_speculative.cuh): one kernel
launched three times, packing with the previous sync's expert scales as a guess, then settling each expert and
repacking the ones whose scale changed (refit_weights v8's idea in the packed layout); "v3" v2 on half-record units
(3 slots of 4 KB per warp instead of 2 of 8 KB), so 4 CTAs fit an SM instead of 3. `VARIANT` is what the op launches.
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
# (stages, min CTAs per SM, units per record) per input dtype. Whole records: bf16/fp16 2 stages x 8 KB per warp,
# 64 KB per CTA -> 3 CTAs (12 warps, ~96 KB of loads in flight) per SM; fp32 16 KB records -> 1 CTA (4 warps).
# Half records: bf16/fp16 3 slots x 4 KB per warp, 48 KB per CTA -> 4 CTAs (16 warps, 128 KB in flight; the
# registers allow no more: 128 per thread); fp32 3 x 8 KB -> 2 CTAs (8 warps).
WHOLE_RECORDS = {"bf16": (2, 3, 1), "f16": (2, 3, 1), "f32": (2, 1, 1)}
HALF_RECORDS = {"bf16": (3, 4, 2), "f16": (3, 4, 2), "f32": (3, 2, 2)}
GEOMETRY = {"v1": WHOLE_RECORDS, "v2": WHOLE_RECORDS, "v3": HALF_RECORDS}
SPECULATIVE = ("v2", "v3")
VARIANTS = ("v1", "v2", "v3")
# The default: v2, speculative like refit_weights' default (docs/toolchain.md, "refit_weights_packed_ v2"): the rollout
# engine syncs each layer's experts into their own buffers, so the previous sync's scales are the usual guess.
VARIANT = os.environ.get("TRACE_KERNELS_REFIT_PACKED_VARIANT", "v2")
if VARIANT not in VARIANTS:
    raise ValueError(f"TRACE_KERNELS_REFIT_PACKED_VARIANT={VARIANT!r}; known: {', '.join(VARIANTS)}")


def smem_bytes(dtype, variant: str) -> int:
    """Dynamic shared memory of a variant's kernel for an input dtype (refit_packed::Config::kSmemBytes)."""
    short = dtype_name(dtype)
    stages, _, units = GEOMETRY[variant][short]
    return (THREADS // 32) * stages * (RECORD_ELEMS // units) * (4 if short == "f32" else 2)


def check_variant(variant: str | None) -> str:
    return resolve_variant(NAME, VARIANTS, VARIANT, variant)  # VARIANT read at call time (tests patch it)


def spec(dtype, groups: int, variant: str | None = None) -> KernelSpec:
    return _spec(dtype, groups, check_variant(variant))


@functools.lru_cache(maxsize=None)
def _spec(dtype, groups: int, variant: str) -> KernelSpec:
    short = dtype_name(dtype)
    if groups not in (1, 2):
        raise ValueError(f"{NAME}: groups must be 1 or 2, got {groups}")
    speculative = variant in SPECULATIVE
    stages, min_blocks, units = GEOMETRY[variant][short]
    smem = smem_bytes(short, variant)
    header = "trace_kernels/refit_packed_speculative.cuh" if speculative else "trace_kernels/refit_packed.cuh"
    return KernelSpec(op=NAME, name=kernel_name(NAME, *variant_parts(short, variant), dims={"g": groups}),
                      template=TEMPLATE,
                      params={"cuda_type": CUDA_TYPES[short], "groups": groups, "stages": stages, "units": units,
                              "min_blocks": min_blocks, "smem": smem, "speculative": speculative},
                      launch={"threads": THREADS, "smem": smem, "variant": variant, "speculative": speculative},
                      headers=(header,))


def amax_spec(dtype) -> KernelSpec:
    """The amax pass: refit_weights' v2 kernel launched with phase 0."""
    return refit_weights.spec(dtype, AMAX_VARIANT)


def specs_for_shape(shape: ModelShape) -> list[KernelSpec]:
    if check_variant(None) in SPECULATIVE:
        return [spec("bf16", 1), spec("bf16", 2)]  # down, gate_up (their own amax)
    return [spec("bf16", 1), spec("bf16", 2), amax_spec("bf16")]  # down, gate_up, amax pass


OP = OpCodegen(NAME, specs_for_shape,
               "expert weights [E, N, K] -> the MoE GEMM's packed, encoded NVFP4 in place (RL weight sync)")
