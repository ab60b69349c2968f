"""`refit_weights_packed_`: expert weights [E, N, K] -> the MoE GEMM's packed, encoded NVFP4, in place.

The RL weight sync in one op: the trainer's weights go straight into the preallocated
`moe_layout.MoEWeights` the MoE GEMM reads (addresses unchanged, so CUDA graphs captured on them stay
valid), bit for bit `refit_weights(w, staging)` followed by `moe_layout.store_fragments_(dst, ...,
groups, kernel=False)`, without the natural-layout staging buffers or the separate moe_pack pass.
GPU, variant v1: refit_weights' v2 amax pass, then the quantize-and-pack pass of
cuda/include/trace_kernels/refit_packed.cuh; v2 (speculative, refit_packed_speculative.cuh): packs with the scales
dst holds from the previous sync as a guess, then repacks only the experts whose scale changed.
CPU tensors run that reference composition.
NVTX range: trace_kernels/refit_weights_packed.
"""

from __future__ import annotations

import torch

from trace_kernels import moe_encoding, moe_layout, nvtx
from trace_kernels.codegen.ops import refit_packed as codegen_packed
from trace_kernels.ops import refit_weights as refit_op
from trace_kernels.ops._common import after_launch, check_cuda_device, check_tensor, resident_ctas, status_buffer

__all__ = ["refit_weights_packed_"]


def _reference(w, codes, block_scales, scale, groups):
    e, n, k = w.shape
    staging = refit_op.allocate(e, n, k, w.device)
    refit_op.refit_weights(w, staging)
    moe_layout.store_fragments_(moe_layout.MoEWeights(codes, block_scales, scale), staging.codes, staging.block_scales,
                                staging.scale, groups, kernel=False)


# The passes variant v1 launches; the benchmark sets ("amax",) to time the amax pass alone (the
# quantize-and-pack pass is the difference). Anything else leaves dst unwritten: never outside it.
PASSES: tuple[str, ...] = ("amax", "pack")


def _launch(w, codes, block_scales, scale, groups):
    from trace_kernels.ops.moe_pack import _Columns
    from trace_kernels.runtime import i32, kernel_for, ptr
    device = check_cuda_device(w)
    experts, n, k = w.shape
    records = experts * (n // moe_layout.TILE_ROWS) * (k // moe_layout.CHUNK_K)
    if records == 0:
        return
    status = status_buffer(device)
    spec = codegen_packed.spec(w.dtype, groups)
    kernel = kernel_for(spec)
    threads, smem = spec.launch["threads"], spec.launch["smem"]
    kernel.allow_dynamic_smem(device, smem)
    warps = threads // 32
    grid = min(resident_ctas(kernel, device, threads, smem), -(-records // warps))
    if grid < 1:
        raise RuntimeError(f"{spec.name}: no CTA of {threads} threads with {smem} bytes of shared memory fits an SM")
    args = [ptr(w), ptr(codes), ptr(block_scales), ptr(scale), None, (_Columns, moe_encoding.encode_columns()),
            i32(n), i32(k), i32(records), ptr(status)]
    with nvtx.annotate("refit_weights_packed"):
        if spec.launch["variant"] == "v2":
            # guesses [E], per expert its amax bits and verdict [2 E], per record its amax bits; all written each call
            workspace = torch.empty(3 * experts + records, dtype=torch.int32, device=w.device)
            args[4] = ptr(workspace)
            for phase, phase_grid, phase_smem in ((1, grid, smem), (2, experts, 0), (3, grid, smem)):
                kernel.launch(device, (phase_grid,), (threads,), [*args, i32(experts), i32(phase)], smem=phase_smem,
                              pdl=phase > 1)
        else:
            workspace = torch.zeros(2 * experts, dtype=torch.int32, device=w.device)  # [2 e]: amax bits of expert e
            args[4] = ptr(workspace)
            refit_op.launch_v2_pass(w, None, None, None, workspace, 0)  # refit v2's amax pass
            if "pack" in PASSES:
                kernel.launch(device, (grid,), (threads,), args, smem=smem)
    after_launch(device)


@torch.library.custom_op("trace_kernels::nvfp4_refit_weights_packed", mutates_args=("codes", "block_scales", "scale"))
def nvfp4_refit_weights_packed_op(w: torch.Tensor, codes: torch.Tensor, block_scales: torch.Tensor, scale: torch.Tensor,
                                  groups: int) -> None:
    if w.device.type == "cpu":
        _reference(w, codes, block_scales, scale, groups)
    else:
        _launch(w, codes, block_scales, scale, groups)


@nvfp4_refit_weights_packed_op.register_fake
def _(w, codes, block_scales, scale, groups):
    return None


def validate(w: torch.Tensor, dst: moe_layout.MoEWeights, groups: int) -> None:
    """Every check before any launch: w's type, rank, shape, dtype, device, contiguity, alignment; dst's layout."""
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"w must be a torch.Tensor, got {type(w).__name__}")
    if not isinstance(dst, moe_layout.MoEWeights):
        raise TypeError(f"dst must be a moe_layout.MoEWeights (see moe_layout.empty_weights), got {type(dst).__name__}")
    if groups not in (1, 2):
        raise ValueError(f"groups must be 1 (plain rows) or 2 (w's rows are [gate; up], stored interleaved), got {groups}")
    if w.dim() != 3:
        raise ValueError(f"w must be [E, N, K], got shape {tuple(w.shape)}")
    experts, n, k = w.shape
    if n % moe_layout.TILE_ROWS or k % moe_layout.CHUNK_K or k == 0:
        raise ValueError(f"w [E, N={n}, K={k}] needs N % {moe_layout.TILE_ROWS} == 0 and K a positive multiple of "
                         f"{moe_layout.CHUNK_K} (the packed layout's records)")
    dst.validate(n=n, k=k, name="dst")
    if dst.num_experts != experts:
        raise ValueError(f"dst has {dst.num_experts} experts, w has {experts}")
    if dst.device != w.device:
        raise ValueError(f"dst is on {dst.device} but w is on {w.device}")
    refit_op.check_source(w)
    if w.device.type == "cuda":
        if experts * (n // moe_layout.TILE_ROWS) * (k // moe_layout.CHUNK_K) >= 2**30:
            raise ValueError(f"w {tuple(w.shape)}: too many 64 x 64 records for the kernel's 32-bit record index")
        for name in ("codes", "block_scales"):  # 16- and 8-byte stores
            check_tensor(getattr(dst, name), f"dst.{name}")
        check_tensor(dst.scale, "dst.scale", aligned=False)


def refit_weights_packed_(w: torch.Tensor, dst: moe_layout.MoEWeights, groups: int = 1) -> moe_layout.MoEWeights:
    """Quantize expert weights w [E, N, K] (bf16/fp16/fp32) into dst's packed buffers in place; returns dst.

    Per expert exactly `nvfp4.quantize(w[e], scale="tensor")`, stored as `moe_layout.store_fragments_`
    stores it (groups=2: w's rows are [gate; up] halves, interleaved by 8 as `interleave_gate_up` does).
    The default variant (v2) takes the scales dst holds from the previous sync as a guess: one read of w when no
    expert's amax moved. On NaN/Inf in an expert the GPU sets the status flag (`ops.raise_on_nonfinite`) and sets
    that expert's block scales to NaN (its first pass may have packed part of it; v1 leaves the expert's packed bytes
    and scale unchanged instead); the CPU path raises ValueError.
    """
    validate(w, dst, groups)
    nvfp4_refit_weights_packed_op(w, dst.codes, dst.block_scales, dst.scale, groups)
    return dst
