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
from trace_kernels.runtime import driver


def allocate(experts: int, n: int, k: int, device) -> nvfp4.NVFP4Tensor:
    """Buffers for refit_weights: codes [E, N, K/2], block_scales [E, N, K/16], scale [E]."""
    return nvfp4.NVFP4Tensor(codes=torch.zeros((experts, n, k // 2), dtype=torch.uint8, device=device),
                             block_scales=torch.zeros((experts, n, k // 16), dtype=torch.float8_e4m3fn, device=device),
                             scale=torch.zeros((experts,), dtype=torch.float32, device=device))


def _reference(w, codes, block_scales, scales):
    for e in range(w.shape[0]):
        q = nvfp4.quantize(w[e], scale="tensor")
        codes[e].copy_(q.codes)
        block_scales[e].copy_(q.block_scales)
        scales[e].copy_(q.scale)


# (grid, ctas_per_group) forced by tests (multi-tile and leftover-CTA paths) and the benchmark sweep;
# for v3 and v5 (grid, experts per chunk); for v4, v10 and v11 (grid, unused); for v6 (grid, most stages or 0).
PLAN_OVERRIDE: tuple[int, int] | None = None


def plan(device: int, kernel, tile_elements: int, experts: int, per_expert: int, elem_bytes: int) -> tuple[int, int]:
    """(grid, ctas_per_group): all CTAs co-resident (cooperative launch); a group of CTAs per expert,
    as many concurrent experts as fit half the L2, each CTA ideally one register-resident tile."""
    if PLAN_OVERRIDE is not None:
        return PLAN_OVERRIDE
    resident = kernel.max_active_blocks_per_sm(device, codegen_refit.CTA) * driver.multiprocessor_count(device)
    tiles = max(1, -(-per_expert // tile_elements))
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    fit_l2 = max(1, (l2 // 2) // max(1, per_expert * elem_bytes))
    groups = max(1, min(experts, fit_l2, resident // min(tiles, resident)))
    per_group = resident // groups
    return groups * per_group, per_group


def plan_v3(device: int, kernel, experts: int, per_expert: int, elem_bytes: int) -> tuple[int, int]:
    """(grid, experts per chunk) for v3: every CTA co-resident; chunks of ~L2/5, so the three chunks
    in flight (one streaming, one waiting, one re-read two steps later) and the outputs stay in L2."""
    if PLAN_OVERRIDE is not None:
        return PLAN_OVERRIDE
    resident = kernel.max_active_blocks_per_sm(device, codegen_refit.CTA) * driver.multiprocessor_count(device)
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return resident, max(1, min(experts, (l2 // 5) // max(1, per_expert * elem_bytes)))


V4_PREFETCH = 2  # v4: tiles loaded ahead of the one whose amax is next


def plan_v4(device: int, kernel, experts: int, per_expert: int, tile_elems: int, elem_bytes: int
            ) -> tuple[int, int, int, int] | None:
    """(grid, lag, stages, shared-memory bytes) for v4, or None when an expert's tiles cannot wait in
    shared memory (then v2 runs). Every CTA co-resident; lag = steps until an expert's last tile has
    passed every CTA (+1); stages = lag + 1 + V4_PREFETCH tile buffers per CTA. Two CTAs per SM
    when they fit, else one."""
    tiles_per_expert = -(-per_expert // tile_elems)
    tiles = experts * tiles_per_expert
    limit = torch.cuda.get_device_properties(device).shared_memory_per_block_optin
    sms = driver.multiprocessor_count(device)
    for per_sm in (2, 1):
        grid = min(tiles, per_sm * sms)
        if PLAN_OVERRIDE is not None:
            grid = PLAN_OVERRIDE[0]
        lag = -(-tiles_per_expert // grid) + 1
        stages = lag + 1 + V4_PREFETCH
        smem = stages * (tile_elems * elem_bytes + 8)
        if smem > limit:
            continue
        kernel.allow_dynamic_smem(device, smem)
        if grid <= resident_ctas(kernel, device, codegen_refit.CTA, smem):
            return grid, lag, stages, smem
    return None


V6_SHARED_RESERVED = 2048  # bytes of the opt-in shared memory left for v6's static mbarriers and counters


def plan_v6(device: int, kernel, experts: int, per_expert: int, elem_bytes: int,
            threads: int | None = None) -> tuple[int, int, int, int] | None:
    """(grid, stages, lag, shared-memory bytes) for v6, or None when too few slots of a warp's slice fit
    in shared memory (then v2 runs). One CTA of `threads` (the kernel's; default `V6_THREADS`) per SM, all
    co-resident; every warp gets stages = min(8, what fits) slots of its slice (at least 3) and quantizes
    lag = (stages - 1) // 2 experts behind its amax, so stages - lag - 1 slices per warp stream ahead."""
    threads = threads or codegen_refit.V6_THREADS
    warps = threads // 32
    grid = driver.multiprocessor_count(device)
    most = 8
    if PLAN_OVERRIDE is not None:
        grid, most = PLAN_OVERRIDE[0], PLAN_OVERRIDE[1] or most
    blocks = per_expert // 16
    slice_blocks = -(-blocks // (grid * warps))
    slot = -(-(slice_blocks * 16 * elem_bytes) // 128) * 128
    budget = torch.cuda.get_device_properties(device).shared_memory_per_block_optin - V6_SHARED_RESERVED
    stages = min(most, 8, budget // (warps * slot))
    if stages < 3:
        return None
    smem = warps * stages * slot
    kernel.allow_dynamic_smem(device, smem)
    if grid > resident_ctas(kernel, device, threads, smem):
        return None
    return grid, stages, (stages - 1) // 2, smem


def plan_v5(device: int, kernel, experts: int, per_expert: int, elem_bytes: int) -> tuple[int, int]:
    """(grid, experts per chunk) for v5: one wave of resident CTAs (each loops over work items);
    chunks of ~L2/4, so the chunk being streamed, the one being quantized and their outputs stay in L2."""
    if PLAN_OVERRIDE is not None:
        return PLAN_OVERRIDE
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return (resident_ctas(kernel, device, codegen_refit.CTA),
            max(1, min(experts, (l2 // 4) // max(1, per_expert * elem_bytes))))


def _kernel_args(device: int, w, codes, block_scales, scales, workspace, plan_a: int, plan_b: int) -> list:
    """The refit kernel's arguments (nvfp4_refit_weights.cu.jinja): w [E, N, K], the outputs, the int32 workspace and
    the variant's two plan integers (refit_weights_kernel.cuh)."""
    from trace_kernels.runtime import i32, i64, ptr
    experts, n, k = w.shape
    return [ptr(w), ptr(codes), ptr(block_scales), ptr(scales), ptr(workspace), i32(experts), i64(n * k), i32(k),
            i32(plan_a), i32(plan_b), ptr(status_buffer(device))]


def tiles_per_expert(spec, w) -> int:
    """Phase-0 tiles of one expert of w [E, N, K] (refit_tiles_per_expert in refit_weights.cuh)."""
    _, n, k = w.shape
    return -(-(n * k // 8) // spec.launch["tile_half_blocks"])


def warp_words(w, tiles: int, threads: int, extra: int = 0) -> torch.Tensor:
    """v8's phase-0 workspace, int32 [E + E * tiles * warps] (each expert's guess, then each warp's amax bits, rewritten
    by every call), after `extra` words of the variant's own."""
    experts = w.shape[0]
    return torch.empty(extra + experts * (1 + tiles * (threads // 32)), dtype=torch.int32, device=w.device)


def one_wave(kernel, device: int, threads: int, items: int) -> int:
    """CTAs for a grid that loops over `items`: one wave of resident CTAs, or PLAN_OVERRIDE's grid."""
    if PLAN_OVERRIDE is not None:
        return PLAN_OVERRIDE[0]
    return min(resident_ctas(kernel, device, threads), items)


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
    guess), then v7 / v8: phase 1 with enough CTAs per expert for one wave over all experts (they return at once
    where the guess held); v9: phase 1 one CTA per expert (its verdict), phase 2 one wave sharing out the tiles of the
    experts whose guess failed. Workspace: v7 [2 E] zeroed (amax bits, guess); v8 [E + E * tiles * warps], written by
    phase 0 (guesses, each warp's amax bits); v9 [2 E] (amax bits, verdict) before v8's."""
    experts = w.shape[0]
    threads, variant = spec.launch["threads"], spec.launch["variant"]
    tiles = tiles_per_expert(spec, w)
    wave = resident_ctas(kernel, device, threads)
    if variant == "v7":
        workspace = torch.zeros(2 * experts, dtype=torch.int32, device=w.device)
    else:
        workspace = warp_words(w, tiles, threads, extra=2 * experts if variant == "v9" else 0)
    if variant == "v9":
        phases = (((tiles, experts), False), ((experts,), True), ((min(wave, tiles * experts),), True))
    else:
        phases = (((tiles, experts), False), ((min(tiles, -(-wave // experts)), experts), variant == "v8" and V8_PDL))
    with nvtx.annotate("refit_weights"):
        for phase, (grid, pdl) in enumerate(phases):
            kernel.launch(device, grid, (threads,),
                          _kernel_args(device, w, codes, block_scales, scales, workspace, 0, phase), pdl=pdl)
    after_launch(device)


# The counters of v10 (int32 [8 + 3 E]: left zeroed by every launch, its last CTA resets them) and v11 (int32 [8 + 2 E]:
# the epoch, which every launch advances, and per-expert marks) per destination, keyed by its scales tensor: zeroed
# once here, so a call needs no memset. Two refits into the same buffers at once, on two streams, would share them;
# they would race on the buffers anyway.
COUNTERS_HEADER = 8
V10_HEADER = COUNTERS_HEADER
_destination_counters: dict[tuple[str, int, int, int], torch.Tensor] = {}


def destination_counters(scales: torch.Tensor, variant: str) -> torch.Tensor:
    key = (variant, scales.device.index, scales.data_ptr(), scales.numel())
    counters = _destination_counters.get(key)
    if counters is None:
        words = COUNTERS_HEADER + {"v10": 3, "v11": 2}[variant] * scales.numel()
        counters = torch.zeros(words, dtype=torch.int32, device=scales.device)
        _destination_counters[key] = counters
    return counters


def v10_counters(scales: torch.Tensor) -> torch.Tensor:
    return destination_counters(scales, "v10")


def launch_v11(kernel, spec, device: int, w, codes, block_scales, scales) -> None:
    """v11: phase 0 over every tile (grid (tiles, E), v8's warp words plus the confirm / disprove marks), then phase 1,
    one wave sharing out the failed experts' tiles (a programmatic dependent launch); words: v8's workspace."""
    from trace_kernels.runtime import i32, i64, ptr
    experts, n, k = w.shape
    threads = spec.launch["threads"]
    tiles = tiles_per_expert(spec, w)
    words = warp_words(w, tiles, threads)
    counters = destination_counters(scales, "v11")
    wave = one_wave(kernel, device, threads, experts * tiles)
    with nvtx.annotate("refit_weights"):
        for phase, grid in ((0, (tiles, experts)), (1, (wave,))):
            kernel.launch(device, grid, (threads,),
                          [ptr(w), ptr(codes), ptr(block_scales), ptr(scales), ptr(words), ptr(counters), i32(experts),
                           i64(n * k), i32(k), i32(phase), ptr(status_buffer(device))], pdl=phase == 1)
    after_launch(device)


def launch_v10(kernel, spec, device: int, w, codes, block_scales, scales) -> None:
    """v10: one persistent launch (refit_weights_v10.cuh), one wave of resident CTAs claiming tiles and requantize
    items from the destination's counters; words: v8's workspace [E + E * tiles * warps], rewritten by every call."""
    from trace_kernels.runtime import i32, i64, ptr
    experts, n, k = w.shape
    threads = spec.launch["threads"]
    tiles = tiles_per_expert(spec, w)
    if experts * tiles + resident_ctas(kernel, device, threads) >= 2**31:
        raise ValueError(f"refit v10: {experts} x {tiles} tiles overflow its 32-bit claim counters")
    words = warp_words(w, tiles, threads)
    counters = v10_counters(scales)
    grid = one_wave(kernel, device, threads, experts * tiles)
    args = [ptr(w), ptr(codes), ptr(block_scales), ptr(scales), ptr(words), ptr(counters), i32(experts), i64(n * k),
            i32(k), ptr(status_buffer(device))]
    with nvtx.annotate("refit_weights"):
        kernel.launch(device, (grid,), (threads,), args)
    after_launch(device)


def _launch_one(kernel, device: int, threads: int, grid: int, w, codes, block_scales, scales, workspace_words: int,
                plan_a: int, plan_b: int, smem: int = 0, cooperative: bool = True) -> None:
    """The one launch of v1 and v3..v6: a zeroed int32 workspace, the variant's two plan integers."""
    workspace = torch.zeros(workspace_words, dtype=torch.int32, device=w.device)
    with nvtx.annotate("refit_weights"):
        kernel.launch(device, (grid,), (threads,),
                      _kernel_args(device, w, codes, block_scales, scales, workspace, plan_a, plan_b),
                      smem=smem, cooperative=cooperative)
    after_launch(device)


def _launch(w, codes, block_scales, scales):
    from trace_kernels.runtime import kernel_for
    device = check_cuda_device(w)
    experts, n, k = w.shape
    if experts == 0 or n == 0:
        return
    spec = codegen_refit.spec(w.dtype)
    kernel = kernel_for(spec)
    threads = spec.launch["threads"]
    args = (w, codes, block_scales, scales)
    if spec.launch["variant"] in ("v7", "v8", "v9"):  # speculative: one read of w when no expert's scale changed
        launch_speculative(kernel, spec, device, *args)
        return
    if spec.launch["variant"] == "v10":  # v9's speculation in one persistent launch
        launch_v10(kernel, spec, device, *args)
        return
    if spec.launch["variant"] == "v11":  # v9's speculation in two launches, verdicts from per-expert marks
        launch_v11(kernel, spec, device, *args)
        return
    if spec.launch["variant"] == "v6":  # a shared-memory pipeline per warp; workspace: amax bits, CTAs arrived
        v6 = plan_v6(device, kernel, experts, n * k, w.element_size(), threads)
        if v6 is not None:
            grid, stages, lag, smem = v6
            _launch_one(kernel, device, threads, grid, *args, 2 * experts, stages, lag, smem=smem)
            return
        spec = codegen_refit.spec(w.dtype, "v2")  # slices too large for three slots per warp
    if spec.launch["variant"] == "v4":  # tiles waiting in shared memory; workspace: amax bits, tiles arrived
        v4 = plan_v4(device, kernel, experts, n * k, spec.launch["tile_half_blocks"] * 8, w.element_size())
        if v4 is not None:
            grid, lag, stages, smem = v4
            _launch_one(kernel, device, threads, grid, *args, 2 * experts, lag, stages, smem=smem)
            return
        spec = codegen_refit.spec(w.dtype, "v2")  # an expert too large to wait in shared memory
    if spec.launch["variant"] == "v2":  # amax pass, then quantize pass: plain launches, no co-residency
        workspace = torch.zeros(2 * experts, dtype=torch.int32, device=w.device)  # amax bits (, unused)
        with nvtx.annotate("refit_weights"):
            for phase in (0, 1):
                launch_v2_pass(w, codes, block_scales, scales, workspace, phase)
        after_launch(device)
        return
    if spec.launch["variant"] == "v5":  # one ordinary launch, a work queue of amax and quantize tiles
        grid, chunk = plan_v5(device, kernel, experts, n * k, w.element_size())
        if grid < 1 or chunk < 1:
            raise ValueError(f"refit v5 plan grid={grid}, chunk={chunk} needs both >= 1")
        # workspace: amax bits, tiles done, items claimed
        _launch_one(kernel, device, threads, grid, *args, 2 * experts + 1, chunk, 0, cooperative=False)
        return
    resident = kernel.max_active_blocks_per_sm(device, threads) * driver.multiprocessor_count(device)
    if spec.launch["variant"] == "v3":  # one cooperative launch, chunks of experts pipelined
        grid, chunk = plan_v3(device, kernel, experts, n * k, w.element_size())
        if not 0 < grid <= resident or chunk < 1:
            raise ValueError(f"refit v3 plan grid={grid}, chunk={chunk} needs 0 < grid <= {resident} (all CTAs "
                             "co-resident) and chunk >= 1")
        _launch_one(kernel, device, threads, grid, *args, 2 * experts, chunk, 0)  # amax bits, chunk arrivals
        return
    grid, per_group = plan(device, kernel, spec.launch["tile_half_blocks"] * 8, experts, n * k, w.element_size())
    if not 0 < per_group <= grid <= resident:
        raise ValueError(f"refit plan grid={grid}, ctas_per_group={per_group} needs 0 < group <= grid <= {resident} "
                         "(all CTAs co-resident)")
    _launch_one(kernel, device, threads, grid, *args, 2 * experts, per_group, 0)  # amax bits, arrivals


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
    already have written part of the expert; v1..v6 leave the expert's buffers unchanged instead).
    """
    validate(w, out)
    nvfp4_refit_weights_op(w, out.codes, out.block_scales, out.scale)
    return out
