"""`moe_pack`: natural per-expert NVFP4 -> the MoE GEMM's packed, encoded weights, on the GPU.

The RL weight sync's second step (refit_weights writes natural NVFP4, this packs it into the
preallocated MoEWeights in place). moe_layout.store_fragments_ dispatches here for CUDA tensors; its
torch path is the reference (tests/gpu/test_moe_gemm.py compares them bit for bit). GPU:
cuda/include/trace_kernels/moe_pack.cuh. NVTX range: trace_kernels/moe_pack.
"""

from __future__ import annotations

import ctypes

import torch

from trace_kernels import moe_encoding, nvtx
from trace_kernels.codegen.ops import moe_pack as codegen_pack
from trace_kernels.ops._common import check_cuda_device


class _Columns(ctypes.Structure):
    """moe_pack::EncodeColumns."""

    _fields_ = [("column", ctypes.c_uint32 * 32)]


def pack_(dst, codes: torch.Tensor, block_scales: torch.Tensor, scale: torch.Tensor, groups: int) -> None:
    """codes uint8 [E, N, K/2], block_scales e4m3 [E, N, K/16], scale float32 [E] (shapes checked by the
    caller, moe_layout.store_fragments_) -> dst (MoEWeights on the same device), in place."""
    from trace_kernels.runtime import i32, i64, kernel_for, ptr
    device = check_cuda_device(codes)
    for name, t in (("block_scales", block_scales), ("scale", scale), ("dst.codes", dst.codes),
                    ("dst.block_scales", dst.block_scales), ("dst.scale", dst.scale)):
        if t.device != codes.device:
            raise ValueError(f"{name} is on {t.device}, codes on {codes.device}")
    if dst.codes.data_ptr() % 4:
        raise ValueError("dst.codes must be 4-byte aligned (the kernel stores 32-bit words)")
    codes, scale_bytes = codes.contiguous(), block_scales.contiguous().view(torch.uint8)
    e, n, half_k = codes.shape
    words = dst.codes.numel() // 4
    if words >= 2**31 * codegen_pack.THREADS or n >= 2**31 or half_k >= 2**31:
        raise ValueError(f"moe_pack: expert weights {tuple(codes.shape)} exceed the kernel's index range")
    spec = codegen_pack.spec(groups)
    if words:
        with nvtx.annotate("moe_pack"):
            kernel_for(spec).launch(device, (-(-words // codegen_pack.THREADS),), (codegen_pack.THREADS,),
                                    [ptr(codes), ptr(scale_bytes), ptr(dst.codes), ptr(dst.block_scales),
                                     (_Columns, moe_encoding.encode_columns()), i32(n), i32(half_k), i64(words)])
    dst.scale.copy_(scale)
