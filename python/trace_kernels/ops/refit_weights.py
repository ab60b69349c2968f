"""`refit_weights`: expert weights [E, N, K] -> per-expert NVFP4 written in place.

The RL policy sync: the trainer's BF16 weights become the rollout's NVFP4 weights without
reallocating (addresses stay fixed for captured CUDA graphs). Layout = the reference's
quantize(w[e], scale="tensor"): codes [E, N, K/2], block_scales [E, N, K/16], scales [E].
"""

from __future__ import annotations

import torch

from trace_kernels import nvfp4, nvtx
from trace_kernels.codegen.ops import refit_weights as codegen_refit
from trace_kernels.ops._common import (KERNEL_DTYPES, after_launch, check_cuda_device, check_tensor,
                                       resident_ctas, status_buffer)


def allocate(experts: int, n: int, k: int, device) -> nvfp4.NVFP4Tensor:
    """Buffers for refit_weights: codes [E, N, K/2], block_scales [E, N, K/16], scale [E]."""
    return nvfp4.NVFP4Tensor(codes=torch.zeros((experts, n, k // 2), dtype=torch.uint8, device=device),
                             block_scales=torch.zeros((experts, n, k // 16), dtype=torch.float8_e4m3fn, device=device),
                             scale=torch.zeros((experts,), dtype=torch.float32, device=device))


def _reference(w, codes, block_scales, scales):
    nvfp4.check_finite(w, "w")  # before any expert is written: a bad call leaves the buffers as they were
    for e in range(w.shape[0]):
        q = nvfp4.quantize(w[e], scale="tensor")
        codes[e].copy_(q.codes)
        block_scales[e].copy_(q.block_scales)
        scales[e].copy_(q.scale)


def _kernel_args(device: int, w, codes, block_scales, scales, workspace, plan_a: int, plan_b: int) -> list:
    """The refit kernel's arguments (nvfp4_refit_weights.cu.jinja): w [E, N, K], the outputs, the int32 workspace and
    two plan integers (refit_weights_kernel.cuh: plan_b is the launch's phase, plan_a unused)."""
    from trace_kernels.runtime import i32, i64, ptr
    experts, n, k = w.shape
    return [ptr(w), ptr(codes), ptr(block_scales), ptr(scales), ptr(workspace), i32(experts), i64(n * k), i32(k),
            i32(plan_a), i32(plan_b), ptr(status_buffer(device))]


def tiles_per_expert(spec, w) -> int:
    """Phase-0 tiles of one expert of w [E, N, K] (refit_tiles_per_expert in refit_weights.cuh)."""
    _, n, k = w.shape
    return -(-(n * k // 8) // spec.launch["tile_half_blocks"])


def warp_words(w, tiles: int, threads: int, extra: int = 0) -> torch.Tensor:
    """The speculative phase 0's workspace, int32 [E + E * tiles * warps] (each expert's guess, then each warp's amax
    bits, rewritten by every call), after `extra` words of the variant's own."""
    experts = w.shape[0]
    return torch.empty(extra + experts * (1 + tiles * (threads // 32)), dtype=torch.int32, device=w.device)


def launch_v2_pass(w, codes, block_scales, scales, workspace, phase: int) -> None:
    """One pass of refit v2 on w [E, N, K]: phase 0 the per-expert amax into workspace (int32 [2 E], zeroed;
    codes / block_scales / scales untouched, may be None), phase 1 the quantization. refit_weights_packed_
    runs phase 0 before its own quantize-and-pack pass."""
    from trace_kernels.runtime import kernel_for
    device = check_cuda_device(w)
    spec = codegen_refit.spec(w.dtype, "v2")
    kernel_for(spec).launch(device, (tiles_per_expert(spec, w), w.shape[0]), (spec.launch["threads"],),
                            _kernel_args(device, w, codes, block_scales, scales, workspace, 0, phase))


# v8: phase 1 as a programmatic dependent launch of phase 0 (the kernel waits for phase 0 either way; False times it
# as an ordinary launch, for the A/B).
V8_PDL = True


def launch_speculative(kernel, spec, device: int, w, codes, block_scales, scales) -> None:
    """The speculative variants' launches. Phase 0 over every tile (quantizing with each expert's previous scale as a
    guess), then v8: phase 1 with enough CTAs per expert for one wave over all experts (they return at once where the
    guess held); v9: phase 1 one CTA per expert (its verdict), phase 2 one wave sharing out the tiles of the experts
    whose guess failed. Workspace: v8 [E + E * tiles * warps], written by phase 0 (guesses, each warp's amax bits);
    v9 [2 E] (amax bits, verdict) before v8's."""
    experts = w.shape[0]
    threads, variant = spec.launch["threads"], spec.launch["variant"]
    tiles = tiles_per_expert(spec, w)
    wave = resident_ctas(kernel, device, threads)
    workspace = warp_words(w, tiles, threads, extra=2 * experts if variant == "v9" else 0)
    if variant == "v9":
        phases = (((tiles, experts), False), ((experts,), True), ((min(wave, tiles * experts),), True))
    else:
        phases = (((tiles, experts), False), ((min(tiles, -(-wave // experts)), experts), V8_PDL))
    with nvtx.annotate("refit_weights"):
        for phase, (grid, pdl) in enumerate(phases):
            kernel.launch(device, grid, (threads,),
                          _kernel_args(device, w, codes, block_scales, scales, workspace, 0, phase), pdl=pdl)
    after_launch(device)


def _launch(w, codes, block_scales, scales):
    from trace_kernels.runtime import kernel_for
    device = check_cuda_device(w)
    experts, n, k = w.shape
    if experts == 0 or n == 0:
        return
    spec = codegen_refit.spec(w.dtype)
    if spec.launch["variant"] in ("v8", "v9"):  # speculative: one read of w when no expert's scale changed
        launch_speculative(kernel_for(spec), spec, device, w, codes, block_scales, scales)
        return
    workspace = torch.zeros(2 * experts, dtype=torch.int32, device=w.device)  # v2: amax bits (, unused)
    with nvtx.annotate("refit_weights"):
        for phase in (0, 1):  # amax pass, then quantize pass: plain launches, no co-residency
            launch_v2_pass(w, codes, block_scales, scales, workspace, phase)
    after_launch(device)


@torch.library.custom_op("trace_kernels::nvfp4_refit_weights", mutates_args=("codes", "block_scales", "scales"))
def nvfp4_refit_weights_op(w: torch.Tensor, codes: torch.Tensor, block_scales: torch.Tensor,
                           scales: torch.Tensor) -> None:
    if w.device.type == "cpu":
        _reference(w, codes, block_scales, scales)
    else:
        _launch(w, codes, block_scales, scales)


@nvfp4_refit_weights_op.register_fake
def _(w, codes, block_scales, scales):
    return None


def validate(w: torch.Tensor, out: nvfp4.NVFP4Tensor) -> None:
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"w must be a torch.Tensor, got {type(w).__name__}")
    if w.dim() != 3:
        raise ValueError(f"w must be [E, N, K], got shape {tuple(w.shape)}")
    experts, n, k = w.shape
    if k == 0 or k % 16:
        raise ValueError(f"w: K={k} must be a positive multiple of 16")
    expect = {"codes": ((experts, n, k // 2), torch.uint8), "block_scales": ((experts, n, k // 16), torch.float8_e4m3fn),
              "scale": ((experts,), torch.float32)}
    for name, (shape, dtype) in expect.items():
        t = getattr(out, name)
        if not isinstance(t, torch.Tensor) or t.dtype != dtype or tuple(t.shape) != shape:
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"out.{name} must be {dtype} {shape}, got {got}")
        if t.device != w.device:
            raise ValueError(f"out.{name} is on {t.device} but w is on {w.device}")
    check_source(w)
    if w.device.type == "cuda":
        for name in expect:
            check_tensor(getattr(out, name), f"out.{name}", aligned=name != "scale")


def check_source(w: torch.Tensor) -> None:
    """w [E, N, K] as the refit kernels (this op's and refit_weights_packed_'s) read it: device,
    dtype, layout and their index limits; CPU tensors need only a floating dtype."""
    experts, n, k = w.shape
    if w.device.type == "cuda":
        check_tensor(w, "w", dtypes=KERNEL_DTYPES)
        if n * k // 16 >= 2**31:
            raise ValueError("w: one expert holds too many blocks for 32-bit block indices")
        if experts > 65535:
            raise ValueError(f"w: E={experts} experts; the amax pass puts experts on the grid's y axis (at most 65535)")
    elif w.device.type == "cpu":
        if w.dtype not in (*KERNEL_DTYPES, torch.float64):
            raise TypeError(f"w must be a floating tensor, got {w.dtype}")
    else:
        raise ValueError(f"w is on {w.device}; supported: cuda and cpu")


def refit_weights(w: torch.Tensor, out: nvfp4.NVFP4Tensor) -> nvfp4.NVFP4Tensor:
    """Quantize expert weights w [E, N, K] into out's preallocated buffers in place; returns out.

    out[e] equals trace_kernels.nvfp4.quantize(w[e], scale="tensor") bit for bit. The default variant (v9) takes
    the scales out holds from the previous refit as a guess: one read of w when no expert's amax moved. On NaN/Inf
    in an expert the GPU sets the status flag and sets that expert's block scales to E4M3 NaN (its first pass may
    already have written part of the expert; v2 leaves the expert's buffers unchanged instead).
    """
    validate(w, out)
    nvfp4_refit_weights_op(w, out.codes, out.block_scales, out.scale)
    return out
