"""Codegen for `nvfp4_quantize`: row quantization of x [rows, D], one kernel per (dtype, D, variant).

Variants (cuda/include/trace_kernels/quantize.cuh): "v1" half blocks per thread (measured on the
H200, docs/toolchain.md), "v2" whole blocks per thread (per-block work once per 16 elements, 2x the
bytes in flight), "v4" v2's arithmetic fed by per-warp rings of bulk copies (persistent grid). `VARIANT` is what the op launches; the benchmark A/B-tests every one of VARIANTS.
"""

from __future__ import annotations

import functools

from trace_kernels.codegen.registry import OpCodegen
from trace_kernels.codegen.spec import CUDA_TYPES, KernelSpec, dtype_name, kernel_name, resolve_variant, variant_parts
from trace_kernels.shapes import ModelShape

NAME = "nvfp4_quantize"
TEMPLATE = "nvfp4_quantize.cu.jinja"
MIN_CTA = 128  # threads per block (v1, v2) unless a row takes more: 83.5% vs 80% of copy at 64 MB (256), the
# shorter last wave (profiling/results/memory_quantize_cta_h200.json); names carry any other value
VARIANTS = ("v1", "v2", "v4")  # v3 (register-pipelined, slower than v2 on the H200) was removed
VARIANT = "v2"  # the default launch: fastest in the same-run A/B of 2026-11-29 (profiling/run_gpu_checks_issue3.sh), bit-exact


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def check_variant(variant: str | None) -> str:
    return resolve_variant(NAME, VARIANTS, VARIANT, variant)  # VARIANT read at call time (tests patch it)


DEFAULT_MIN_CTA = MIN_CTA  # the block size kernel names leave out


V4_CTA = 256        # 8 warps, each with its own ring of bulk-copy buffers
V4_ITEM_BYTES = 4096  # bytes of x per bulk copy (whole rows, at least one)
V4_STAGES = 3       # bulk copies in flight per warp: ~96 KB of shared memory per CTA at 4 KB (2 was slower too)


def tiling(dtype, d: int, variant: str = "v1", min_cta: int = MIN_CTA) -> tuple[int, int]:
    """(threads per row, threads per block) for rows of d elements.

    v1: ~4 half blocks (64 B of 16-bit input) per thread; v2: ~4 whole blocks (128 B; 2 for FP32)
    per thread, so a 2048-wide BF16 row is one warp (no shared-memory reduction); v4: v2's, but a
    row never spans more than a warp (wider rows take more blocks per thread).
    """
    units = d // 8 if variant == "v1" else d // 16
    per_thread = 2 if variant != "v1" and dtype_name(dtype) == "f32" else 4  # FP32: 128 B, as 16-bit
    tpr = min(1024, max(2 if variant == "v1" else 1, _pow2_ceil(-(-units // per_thread))))
    if variant == "v4":
        return max(2, min(tpr, 32)), V4_CTA  # TPR 1 spills a register in the item loop
    return tpr, max(tpr, min_cta)


def v4_pipeline(dtype, d: int) -> tuple[int, int]:
    """(rows per bulk copy, shared-memory bytes per CTA) of v4: items of whole rows, about
    V4_ITEM_BYTES, a multiple of the rows a warp quantizes at once (at least one such pass)."""
    tpr, cta = tiling(dtype, d, "v4")
    row_bytes = d * _ELEMENT_BYTES[dtype_name(dtype)]
    per_pass = 32 // tpr
    rows = max(per_pass, V4_ITEM_BYTES // row_bytes // per_pass * per_pass)
    return rows, (cta // 32) * V4_STAGES * (rows * row_bytes + 8)


_ELEMENT_BYTES = {"bf16": 2, "f16": 2, "f32": 4}


V4_MAX_ROW_BYTES = 8192  # v4 holds a lane's share of a row in registers: at most 8 blocks of 16-bit input


def v4_supports(dtype, d: int) -> bool:
    return d * _ELEMENT_BYTES[dtype_name(dtype)] <= V4_MAX_ROW_BYTES


def spec(dtype, d: int, variant: str | None = None) -> KernelSpec:
    """The kernel for rows of d elements; variant None = VARIANT, except that rows v4 cannot take
    (wider than V4_MAX_ROW_BYTES) launch v2 when v4 is the default."""
    resolved = check_variant(variant)
    if resolved == "v4" and not v4_supports(dtype, d):
        if variant is not None:
            raise ValueError(f"{NAME}: v4 takes rows of at most {V4_MAX_ROW_BYTES} bytes, got D={d} of {dtype}")
        resolved = "v2"
    return _spec(dtype, d, resolved, MIN_CTA)  # MIN_CTA read at call time (the benchmark sweeps it)


# memoized: the ops build their spec on every launch; spec() resolves the variant first, since VARIANT may change
@functools.lru_cache(maxsize=None)
def _spec(dtype, d: int, variant: str, min_cta: int) -> KernelSpec:
    if d <= 0 or d % 16:
        raise ValueError(f"{NAME}: D={d} must be a positive multiple of 16")
    short = dtype_name(dtype)
    tpr, cta = tiling(dtype, d, variant, min_cta)
    rows_per_item, smem = v4_pipeline(dtype, d) if variant == "v4" else (1, 0)
    return KernelSpec(
        op=NAME,
        name=kernel_name(NAME, *variant_parts(short, variant),
                         dims={"d": d, **({"cta": cta} if cta != tiling(dtype, d, variant, DEFAULT_MIN_CTA)[1] else {})}),
        template=TEMPLATE,
        params={"cuda_type": CUDA_TYPES[short], "d": d, "tpr": tpr, "cta": cta, "variant": int(variant[1:]),
                "rows_per_item": rows_per_item, "stages": V4_STAGES if variant == "v4" else 1,
                "min_blocks": 0},  # __launch_bounds__ min blocks per SM (0: none); 4 spills v2
        # v4 is persistent: rows_per_cta is one pass of its warps; the launcher sizes the grid by occupancy
        launch={"threads": cta, "rows_per_cta": cta // tpr if variant != "v4" else (cta // 32) * rows_per_item,
                "persistent": variant == "v4", "smem_bytes": smem},
        headers=("trace_kernels/quantize.cuh",),
    )


def quantize_dims(shape: ModelShape) -> list[int]:
    """Row lengths a layer quantizes: MoE input (H), down-GEMM input (I), KV heads (head_dim)."""
    return sorted({shape.hidden, shape.intermediate, shape.head_dim})


def specs_for_shape(shape: ModelShape) -> list[KernelSpec]:
    return [spec("bf16", d) for d in quantize_dims(shape)]


OP = OpCodegen(NAME, specs_for_shape, "x [rows, D] -> NVFP4 codes, scales, guidance bits, BF16 operand")
