"""`guided_fake_quantize`: trainer x + rollout guidance -> guided fake-quantized x (straight-through
gradient) and audit counters. GPU: cuda/include/trace_kernels/guided_fake_quantize*.cuh.

Counters (int64 [4]): elements, elements where guidance changed round-to-nearest's code, and (full
guidance only) elements where the chosen / the round-to-nearest code equals the rollout's.
Round-to-nearest here uses the rollout's scales, so [1] counts exactly the flips guidance made.
"""

from __future__ import annotations

import torch

from trace_kernels import nvfp4, nvtx
from trace_kernels.codegen.ops import guided_fake_quantize as codegen_guided
from trace_kernels.ops._common import (KERNEL_DTYPES, after_launch, check_cuda_device, check_last_dim, check_rows,
                                       check_tensor, new_output, resident_ctas, status_buffer)

GRID_LIMIT: int | None = None  # tests: cap the persistent grid so each CTA takes several passes
COUNTER_NAMES = ("elements", "changed_by_guidance", "guided_equals_rollout", "nearest_equals_rollout")


def _signed_index(codes: torch.Tensor) -> torch.Tensor:
    c = nvfp4.unpack_codes(codes)
    m = (c & 7).to(torch.int16)
    return torch.where((c & 8) != 0, -m, m)


def reference_counters(x: torch.Tensor, guidance: nvfp4.Guidance) -> torch.Tensor:
    """The counters the kernel accumulates, computed with the reference (int64 [4])."""
    guided = nvfp4.guided_quantize(x, guidance).codes
    blocks = x.detach().to(torch.float32).reshape(*x.shape[:-1], x.shape[-1] // 16, 16)
    s = guidance.scale.unsqueeze(-1) if guidance.scale.dim() else guidance.scale
    d = (guidance.block_scales.to(torch.float32) * s).unsqueeze(-1)  # [..., D/16, 1]
    y = blocks / torch.where(d == 0, torch.ones_like(d), d).expand_as(blocks)
    nearest4 = torch.where(d == 0, torch.zeros_like(y, dtype=torch.uint8), nvfp4.e2m1_round(y))
    nearest = nvfp4.pack_codes(nearest4.reshape(x.shape))
    k_guided, k_nearest = _signed_index(guided), _signed_index(nearest)
    out = [x.numel(), int((k_guided != k_nearest).sum())]
    if guidance.mode == "full":
        k_rollout = _signed_index(guidance.codes)
        out += [int((k_guided == k_rollout).sum()), int((k_nearest == k_rollout).sum())]
    else:
        out += [0, 0]
    return torch.tensor(out, dtype=torch.int64)


def _guidance(scale, block_scales, mantissa_bits, codes) -> nvfp4.Guidance:
    return nvfp4.Guidance(scale=scale, block_scales=block_scales, mantissa_bits=mantissa_bits, codes=codes)


def _launch(x, scale, block_scales, mantissa_bits, codes, with_counters):
    from trace_kernels.runtime import i32, kernel_for, ptr
    device = check_cuda_device(x)
    d = x.shape[-1]
    rows = x.numel() // d
    out = new_output(x.shape, x.dtype, x.device)
    # without counters the kernel gets a null pointer and skips the per-element counting
    counters = torch.zeros(4 if with_counters else 0, dtype=torch.int64, device=x.device)
    if rows:
        row_scales = scale if scale.dim() else scale.expand(rows).contiguous()  # tensor scale -> per row
        spec = codegen_guided.spec(x.dtype, d, mode=codegen_guided.mode_of(codes is not None, with_counters))
        launch = spec.launch
        grid = -(-(rows * d // launch["elements_per_unit"]) // launch["units_per_cta"])
        kernel = kernel_for(spec)
        # persistent grid-stride kernels: at most one wave of as many CTAs as the kernel's registers allow
        grid = min(grid, GRID_LIMIT or max(1, resident_ctas(kernel, device, launch["threads"])))
        with nvtx.annotate("guided_fake_quantize"):
            kernel.launch(device, (grid,), (spec.launch["threads"],),
                          [ptr(x), ptr(row_scales), ptr(block_scales), ptr(mantissa_bits), ptr(codes), ptr(out),
                           ptr(counters if with_counters else None), i32(rows), ptr(status_buffer(device))])
        after_launch(device)
    return out, counters


@torch.library.custom_op("trace_kernels::nvfp4_guided_fake_quantize", mutates_args=())
def nvfp4_guided_fake_quantize_op(x: torch.Tensor, scale: torch.Tensor, block_scales: torch.Tensor,
                                  mantissa_bits: torch.Tensor | None,
                                  codes: torch.Tensor | None,
                                  with_counters: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(guided fake-quantized x, counters int64 [4], or [0] when with_counters is False); exactly
    one of mantissa_bits / codes is given."""
    if x.device.type == "cpu":
        guidance = _guidance(scale, block_scales, mantissa_bits, codes)
        counters = reference_counters(x, guidance) if with_counters else torch.zeros(0, dtype=torch.int64)
        return nvfp4.guided_fake_quantize(x, guidance).detach(), counters
    return _launch(x, scale, block_scales, mantissa_bits, codes, with_counters)


@nvfp4_guided_fake_quantize_op.register_fake
def _(x, scale, block_scales, mantissa_bits, codes, with_counters=True):
    return torch.empty_like(x), x.new_empty((4 if with_counters else 0,), dtype=torch.int64)


def _setup_context(ctx, inputs, output):
    pass


def _backward(ctx, grad_out, grad_counters):
    return grad_out, None, None, None, None, None  # straight-through


nvfp4_guided_fake_quantize_op.register_autograd(_backward, setup_context=_setup_context)


def validate(x: torch.Tensor, guidance: nvfp4.Guidance) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not isinstance(guidance, nvfp4.Guidance):
        raise TypeError(f"guidance must be a trace_kernels.nvfp4.Guidance, got {type(guidance).__name__}")
    d = check_last_dim(x)
    nvfp4._check_guidance(x, guidance)  # shapes, dtypes, devices (the reference's own rules)
    if x.device.type == "cuda":
        check_tensor(x, "x", dtypes=KERNEL_DTYPES)
        check_rows(x.numel() // d)
        payload = ("mantissa_bits", guidance.mantissa_bits) if guidance.mode == "compact" else ("codes", guidance.codes)
        check_tensor(guidance.scale, "guidance.scale", aligned=False)
        check_tensor(guidance.block_scales, "guidance.block_scales", aligned=False)
        check_tensor(payload[1], f"guidance.{payload[0]}", aligned=guidance.mode == "full")


def guided_fake_quantize(x: torch.Tensor, guidance: nvfp4.Guidance, *, return_counters: bool = False):
    """Guided fake quantization of x [..., D] against rollout guidance, bit-exact with
    trace_kernels.nvfp4.guided_fake_quantize; gradient passes straight through.

    return_counters=True also returns int64 [4] counters (COUNTER_NAMES) for audits.
    """
    validate(x, guidance)
    out, counters = nvfp4_guided_fake_quantize_op(x, guidance.scale, guidance.block_scales,
                                                  guidance.mantissa_bits, guidance.codes, return_counters)
    return (out, counters) if return_counters else out
