"""`quantize`: x [..., D] -> NVFP4 (row scales) + optional compact guidance bits + BF16 operand.

GPU: one kernel pass (cuda/include/trace_kernels/quantize.cuh). CPU: trace_kernels.nvfp4.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trace_kernels import nvfp4, nvtx
from trace_kernels.codegen.ops import quantize as codegen_quantize
from trace_kernels.ops._common import (KERNEL_DTYPES, after_launch, check_cuda_device, check_last_dim, check_rows,
                                       check_tensor, new_output, status_buffer)

_EMPTY_U8 = (0,)


@dataclass(frozen=True)
class QuantizeResult:
    q: nvfp4.NVFP4Tensor  # codes [..., D/2], block_scales [..., D/16], scale [...]
    mantissa_bits: torch.Tensor | None  # uint8 [..., D/8] (compact guidance payload) when asked
    dequant: torch.Tensor | None  # bf16 [..., D] = value(code) * block_scale (no row scale) when asked

    def guidance(self) -> nvfp4.Guidance:
        if self.mantissa_bits is None:
            raise ValueError("quantize(..., guidance=True) was not requested")
        return nvfp4.Guidance(scale=self.q.scale, block_scales=self.q.block_scales, mantissa_bits=self.mantissa_bits)


def _reference(x, emit_guidance, emit_dequant):
    q = nvfp4.quantize(x, scale="row")
    bits = (nvfp4.make_guidance(q, "compact").mantissa_bits if emit_guidance
            else x.new_empty(_EMPTY_U8, dtype=torch.uint8))
    dq = (nvfp4.dequantize(q, torch.bfloat16, apply_scale=False) if emit_dequant
          else x.new_empty(_EMPTY_U8, dtype=torch.bfloat16))
    return q.codes, q.block_scales, q.scale, bits, dq


def _launch(x, emit_guidance, emit_dequant):
    check_cuda_device(x)
    d = x.shape[-1]
    lead = x.shape[:-1]
    codes = new_output((*lead, d // 2), torch.uint8, x.device)
    block_scales = new_output((*lead, d // 16), torch.float8_e4m3fn, x.device)
    scale = new_output(lead, torch.float32, x.device)
    bits = new_output((*lead, d // 8) if emit_guidance else _EMPTY_U8, torch.uint8, x.device)
    dq = new_output((*lead, d) if emit_dequant else _EMPTY_U8, torch.bfloat16, x.device)
    launch_into(x, codes, block_scales, scale, bits if emit_guidance else None, dq if emit_dequant else None)
    return codes, block_scales, scale, bits, dq


def launch_into(x, codes, block_scales, scale, bits, dq, *, pdl: bool = False) -> None:
    """The quantize kernel on x [rows, D] (contiguous, CUDA) into preallocated outputs (bits / dq None:
    not written). Callers check shapes, dtypes and devices (quantize, moe_gemm.moe_gate_up).
    pdl: a programmatic dependent launch (the kernel waits for the previous one before it reads x)."""
    from trace_kernels.runtime import i32, kernel_for, ptr
    device = check_cuda_device(x)
    d = x.shape[-1]
    rows = x.numel() // d
    if rows:
        spec = codegen_quantize.spec(x.dtype, d)
        grid = -(-rows // spec.launch["rows_per_cta"])
        with nvtx.annotate("quantize"):
            kernel_for(spec).launch(device, (grid,), (spec.launch["threads"],),
                                    [ptr(x), ptr(codes), ptr(block_scales), ptr(scale), ptr(bits), ptr(dq), i32(rows),
                                     ptr(status_buffer(device))], pdl=pdl)
        after_launch(device)


@torch.library.custom_op("trace_kernels::nvfp4_quantize", mutates_args=())
def nvfp4_quantize_op(x: torch.Tensor, emit_guidance: bool, emit_dequant: bool) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes, block_scales, scale, mantissa_bits or [0], dequant or [0]) of x [..., D]."""
    if x.device.type == "cpu":
        return _reference(x, emit_guidance, emit_dequant)
    return _launch(x, emit_guidance, emit_dequant)


@nvfp4_quantize_op.register_fake
def _(x, emit_guidance, emit_dequant):
    d = x.shape[-1]
    lead = x.shape[:-1]
    return (x.new_empty((*lead, d // 2), dtype=torch.uint8),
            x.new_empty((*lead, d // 16), dtype=torch.float8_e4m3fn),
            x.new_empty(lead, dtype=torch.float32),
            x.new_empty((*lead, d // 8) if emit_guidance else _EMPTY_U8, dtype=torch.uint8),
            x.new_empty((*lead, d) if emit_dequant else _EMPTY_U8, dtype=torch.bfloat16))


def validate(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    check_last_dim(x)
    if x.device.type == "cuda":
        check_tensor(x, "x", dtypes=KERNEL_DTYPES)
        check_rows(x.numel() // x.shape[-1])
    elif x.device.type != "cpu":
        raise ValueError(f"x is on {x.device}; supported: cuda (sm_90a kernels) and cpu (reference)")


def quantize(x: torch.Tensor, *, guidance: bool = False, dequant: bool = False) -> QuantizeResult:
    """Quantize x [..., D] to NVFP4 with row scales, bit-exact with trace_kernels.nvfp4.quantize.

    guidance=True also returns the mantissa bits (compact TRACE guidance, uint8 [..., D/8]);
    dequant=True also returns value(code) * block_scale in BF16 [..., D] (the GEMM operand).
    Non-finite input on the GPU sets the status flag (see raise_on_nonfinite) instead of raising
    here, which would need a host sync; on the CPU it raises ValueError at once.
    """
    validate(x)
    codes, block_scales, scale, bits, dq = nvfp4_quantize_op(x, guidance, dequant)
    return QuantizeResult(nvfp4.NVFP4Tensor(codes, block_scales, scale), bits if guidance else None,
                          dq if dequant else None)
